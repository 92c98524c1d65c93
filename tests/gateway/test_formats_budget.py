"""Budget races in every wire format: 32 concurrent streaming clients (embeddings: plain,
they are never streamed) against a run cap set to run out mid-way, over a real HTTP
upstream; the settled total never exceeds the cap, the refusals come in each format's
own error shape, and replay re-derives every decision (overshoot 0)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anthropic
import openai
import pytest

from holedger.gateway.config import GatewayConfig, UpstreamConfig
from holedger.gateway.serve import AppServer
from holedger.gateway.sim_server import create_simulator_app
from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.runs import replay_run

from .helpers import SIM_MODEL, Env, close_env, make_terms, open_env

CLIENTS = 32
QUESTION = "What was the revenue of Acme Corp in Q2 2023?"
LIMIT = 120


@pytest.fixture(scope="module")
def http_upstream() -> Iterator[AppServer]:
    # Streams take a while, so reservations overlap while calls are in flight.
    server = AppServer(create_simulator_app(chunk_delay_s=0.002)).start()
    yield server
    server.stop()


def race_env(sqlite_url: str, upstream: AppServer, cap: int) -> Env:
    config = GatewayConfig(
        upstream=UpstreamConfig(base_url=upstream.base_url, provider="simulator")
    )
    return open_env(sqlite_url, make_terms(target_tokens=cap), config)


async def openai_chat(env: Env, token: str) -> str:
    sdk = openai.AsyncOpenAI(base_url=env.base_url, api_key=token, max_retries=2)
    stream = await sdk.chat.completions.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=LIMIT,
        stream=True,
    )
    async for _ in stream:
        pass
    return "ok"


async def openai_responses(env: Env, token: str) -> str:
    sdk = openai.AsyncOpenAI(base_url=env.base_url, api_key=token, max_retries=2)
    stream = await sdk.responses.create(
        model=SIM_MODEL, input=QUESTION, max_output_tokens=LIMIT, stream=True
    )
    async for _ in stream:
        pass
    return "ok"


async def openai_embeddings(env: Env, token: str) -> str:
    sdk = openai.AsyncOpenAI(base_url=env.base_url, api_key=token, max_retries=2)
    await sdk.embeddings.create(model=SIM_MODEL, input=[QUESTION] * 8)
    return "ok"


async def anthropic_messages(env: Env, token: str) -> str:
    base = env.base_url.removesuffix("/v1")
    sdk = anthropic.AsyncAnthropic(base_url=base, api_key=token, max_retries=2)
    stream = await sdk.messages.create(
        model=SIM_MODEL,
        max_tokens=LIMIT,
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
    )
    async for _ in stream:
        pass
    return "ok"


CLIENTS_BY_FORMAT = {
    "chat": openai_chat,
    "responses": openai_responses,
    "embeddings": openai_embeddings,
    "messages": anthropic_messages,
}


async def _race(env: Env, fmt: str) -> list[str]:
    call = CLIENTS_BY_FORMAT[fmt]

    async def one(i: int) -> str:
        try:
            return await call(env, env.trial_token(f"t{i}"))
        except (openai.APIStatusError, anthropic.APIStatusError) as exc:
            body = exc.body
            if fmt == "messages":  # an Anthropic error object
                assert isinstance(exc, anthropic.APIStatusError)
                error = exc.response.json()
                assert error["type"] == "error", error
                code = error["error"]["code"]
                assert exc.status_code != 402 or error["error"]["type"] == "billing_error"
            else:
                assert isinstance(body, dict), body
                code = body.get("code")
            return f"{exc.status_code} {code}"

    return await asyncio.gather(*(one(i) for i in range(CLIENTS)))


@pytest.mark.parametrize("fmt", sorted(CLIENTS_BY_FORMAT))
def test_concurrent_clients_never_overshoot_the_cap(
    sqlite_url: str, http_upstream: AppServer, fmt: str
) -> None:
    # First one call alone, to size a cap that lets about half of the clients through.
    probe = race_env(sqlite_url.replace(".db", "-probe.db"), http_upstream, 10**6)
    try:
        asyncio.run(CLIENTS_BY_FORMAT[fmt](probe, probe.trial_token()))
        reserved = max(c.reserved for c in probe.calls())
    finally:
        close_env(probe)
    cap = reserved * CLIENTS // 2
    env = race_env(sqlite_url, http_upstream, cap)
    try:
        outcomes = asyncio.run(_race(env, fmt))
        assert "ok" in outcomes and "402 budget_exhausted" in outcomes, outcomes
        calls = env.calls()
        assert {c.format for c in calls} == {fmt}
        settled = sum(c.tokens.total for c in calls if c.reservation_index is not None)
        assert 0 < settled <= cap
        for i in range(CLIENTS):
            env.gateway.close_trial(env.run_id, f"t{i}")
        env.ledger.close_run(env.run_id)
        report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
        assert report.verified, report.failed_checks()
        section = report.sections["gateway"]
        assert section["overshoot"] == 0 and section["target_settled"] == settled
        assert section["denied"].get("budget_exhausted", 0) == outcomes.count(
            "402 budget_exhausted"
        )
    finally:
        close_env(env)
