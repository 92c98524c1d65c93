"""Reserve-then-settle: no overshoot under concurrency, disconnects charged, denials final."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from holedger.gateway.config import GatewayConfig, UpstreamConfig
from holedger.gateway.serve import AppServer
from holedger.gateway.sim_server import create_simulator_app
from holedger.gateway.wire import Receive, Scope, Send
from holedger.replay.runs import replay_run

from .helpers import SIM_MODEL, Env, close_env, make_terms, open_env

CLIENTS = 40
CALLS_EACH = 4
MESSAGES = [{"role": "user", "content": "What was Acme's revenue in 2023?"}]


def wait_for_calls(env: Env, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(env.calls()) < count:
        assert time.monotonic() < deadline, "the gateway did not record the call"
        time.sleep(0.05)


@pytest.fixture
def http_upstream() -> Iterator[AppServer]:
    server = AppServer(create_simulator_app()).start()
    yield server
    server.stop()


@pytest.fixture
def small_cap(sqlite_url: str, http_upstream: AppServer) -> Iterator[Env]:
    # A real HTTP upstream, so calls really overlap between reservation and settlement.
    config = GatewayConfig(upstream=UpstreamConfig(base_url=http_upstream.base_url))
    e = open_env(sqlite_url, make_terms(target_tokens=3000), config)
    yield e
    close_env(e)


def test_concurrent_clients_never_overshoot_a_small_cap(small_cap: Env) -> None:
    env = small_cap
    tokens = [env.trial_token(f"t{i}") for i in range(CLIENTS)]
    statuses: list[int] = []

    async def client(token: str) -> None:
        sdk = openai.AsyncOpenAI(base_url=env.base_url, api_key=token, max_retries=2)
        for i in range(CALLS_EACH):
            try:
                if i % 2:
                    stream = await sdk.chat.completions.create(
                        model=SIM_MODEL, messages=MESSAGES, max_tokens=64, stream=True
                    )
                    async for _ in stream:
                        pass
                else:
                    await sdk.chat.completions.create(
                        model=SIM_MODEL, messages=MESSAGES, max_tokens=64
                    )
                statuses.append(200)
            except openai.APIStatusError as exc:
                statuses.append(exc.status_code)
        await sdk.close()

    async def main() -> None:
        await asyncio.gather(*(client(t) for t in tokens))

    asyncio.run(main())
    calls = env.calls()
    settled = sum(c.tokens.total for c in calls)
    assert 402 in statuses and 200 in statuses
    assert settled <= 3000  # overshoot exactly 0
    # Every 402 reached the client once: the SDK did not retry a budget denial.
    denied = [c for c in calls if c.code == "budget_exhausted"]
    assert len(denied) == statuses.count(402)
    assert all(not c.allowed and c.status == 402 and c.budget is not None for c in denied)
    # Concurrency really happened: some decision saw other calls' reservations outstanding.
    assert any(c.budget is not None and c.budget.outstanding > 0 for c in calls)
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id)
    assert report.verified, report.failed_checks()
    assert report.sections["gateway"]["overshoot"] == 0


def test_budget_denial_is_final_for_the_sdk(sqlite_url: str) -> None:
    env = open_env(sqlite_url, make_terms(target_tokens=100))
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
        with pytest.raises(openai.APIStatusError) as info:
            sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert info.value.status_code == 402
        assert info.value.response.headers["x-should-retry"] == "false"
        body = info.value.response.json()
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "budget_exhausted"
        assert len(env.calls()) == 1  # one attempt, not three
    finally:
        close_env(env)


def test_per_trial_cap_holds_while_the_run_has_room(sqlite_url: str) -> None:
    env = open_env(sqlite_url, make_terms(target_tokens=100_000, per_trial=400))
    try:
        first = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token("a"), max_retries=0)
        second = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token("b"), max_retries=0)
        outcomes = []
        for _ in range(6):
            try:
                first.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=64)
                outcomes.append(200)
            except openai.APIStatusError as exc:
                outcomes.append(exc.status_code)
        assert 402 in outcomes
        second.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=64)
        assert env.gateway.trial_usage(env.run_id, "a").tokens.total <= 400
        assert any("trial token budget" in (c.reason or "") for c in env.calls())
    finally:
        close_env(env)


@pytest.fixture
def slow_upstream() -> Iterator[AppServer]:
    server = AppServer(create_simulator_app(chunk_delay_s=0.3)).start()
    yield server
    server.stop()


def test_mid_stream_disconnect_is_charged_its_reservation(
    sqlite_url: str, slow_upstream: AppServer
) -> None:
    config = GatewayConfig(upstream=UpstreamConfig(base_url=slow_upstream.base_url))
    env = open_env(sqlite_url, make_terms(), config)
    try:
        body = {"model": SIM_MODEL, "messages": MESSAGES, "stream": True, "max_tokens": 200}
        headers = {"authorization": f"Bearer {env.trial_token()}"}
        with (
            httpx.Client(timeout=10) as http,
            http.stream(
                "POST", f"{env.base_url}/chat/completions", json=body, headers=headers
            ) as r,
        ):
            assert r.status_code == 200
            first = next(r.iter_lines())
            assert first.startswith("data:")
            # leave mid-stream: closing the response drops the connection
        wait_for_calls(env, 1)
        (event,) = env.calls()
        assert event.stream and event.usage_estimated
        assert event.tokens.total == event.reserved > 200
        assert "disconnected" in (event.reason or "")
        assert env.gateway.trial_usage(env.run_id, "t1").complete
    finally:
        close_env(env)


async def truncated_upstream(scope: Scope, receive: Receive, send: Send) -> None:
    """An upstream whose stream stops after one chunk, without usage or [DONE]."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body", False):
        pass
    chunk = (
        b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"par"},"finish_reason":null}]}\n\n'
    )
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": chunk, "more_body": False})


def test_stream_cut_before_usage_is_charged_its_reservation(tmp_path: Path) -> None:
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), upstream_app=truncated_upstream)
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
        chunks = list(sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, stream=True))
        assert len(chunks) == 1
        (event,) = env.calls()
        assert event.usage_estimated and event.tokens.total == event.reserved
        assert event.reason == "upstream sent no usage chunk"
    finally:
        close_env(env)


def test_the_gateway_fails_closed_while_it_cannot_write_its_ledger(sqlite_url: str) -> None:
    env = open_env(sqlite_url, make_terms())
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert env.gateway.flush()
        engine = env.ledger.app.engine
        with engine.begin() as conn:  # break the blob table under the running gateway
            conn.exec_driver_sql("ALTER TABLE holedger_blobs RENAME TO holedger_blobs_away")
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)  # answered; write fails
        deadline = time.monotonic() + 20
        while env.gateway.writer.failure is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(openai.APIStatusError) as info:
            sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert info.value.status_code == 503
        assert info.value.response.json()["error"]["code"] == "ledger_unavailable"
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE holedger_blobs_away RENAME TO holedger_blobs")
        assert env.gateway.flush(30)
        assert env.gateway.writer.failure is None
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert len(env.calls()) == 3  # the call answered during the outage was not lost
    finally:
        close_env(env)
