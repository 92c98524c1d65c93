"""The gateway on PostgreSQL, and the ``holedger sim serve`` command."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from pgdb import fresh_database

from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.runs import replay_run

from .helpers import SIM_MODEL, close_env, make_terms, open_env


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database, so no other test (or test process) shares its tables."""
    yield from fresh_database("holedger_gateway")


@pytest.mark.postgres
def test_budget_holds_on_postgresql(pg_url: str) -> None:
    env = open_env(pg_url, make_terms(target_tokens=600))
    try:
        tokens = [env.trial_token(f"t{i}") for i in range(32)]

        async def one(token: str) -> int:
            sdk = openai.AsyncOpenAI(base_url=env.base_url, api_key=token, max_retries=0)
            try:
                await sdk.chat.completions.create(
                    model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=40
                )
                return 200
            except openai.APIStatusError as exc:
                return exc.status_code
            finally:
                await sdk.close()

        async def main() -> list[int]:
            return list(await asyncio.gather(*(one(t) for t in tokens)))

        statuses = asyncio.run(main())
        assert 402 in statuses
        calls = env.calls()
        assert sum(c.tokens.total for c in calls) <= 600
        env.ledger.close_run(env.run_id)
        report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
        assert report.verified, report.failed_checks()
    finally:
        close_env(env)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sim_serve_command_answers_like_an_openai_upstream() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "holedger.cli", "sim", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 20
        while True:
            try:
                models = httpx.get(f"{base}/models", timeout=1).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert [m["id"] for m in models["data"]] == [SIM_MODEL]
        sdk = openai.OpenAI(base_url=base, api_key="unused")
        chunks = list(
            sdk.chat.completions.create(
                model=SIM_MODEL,
                messages=[{"role": "user", "content": "hello"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.total_tokens > 0
    finally:
        proc.terminate()
        proc.wait(10)
