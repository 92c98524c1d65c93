"""A run's close ends every token of it, atomically as far as any client can observe.

32 concurrent clients call the gateway over real HTTP with the run's tokens (two
optimizer tokens and a trial token) while the run is closed; 16 rounds, each on a new run
of the same ledger and gateway. Every round: a call sent after the close returned is
refused 403 ``run_closed`` with ``x-should-retry: false`` and records nothing; every call
answered before is recorded before RunClosed; no event follows RunClosed; the run
verifies. Then a closed run's token and ``holedger token`` are refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from holedger.errors import RunClosedError
from holedger.replay.runs import replay_run

from .helpers import SIM_MODEL, Env, close_env, digest, make_terms, open_env

HOLEDGER = (sys.executable, "-m", "holedger")
CLIENTS = 32
ROUNDS = 16
WARM = 8  # answered calls before the close
BODY = json.dumps(
    {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
).encode()


@dataclass
class Seen:
    sent: float
    status: int
    code: str | None
    retry: str | None
    call_id: str | None


async def hammer(
    client: httpx.AsyncClient, url: str, token: str, stop: asyncio.Event, out: list[Seen]
) -> None:
    while not stop.is_set():
        sent = time.monotonic()
        resp = await client.post(url, content=BODY, headers={"authorization": f"Bearer {token}"})
        code = resp.json().get("error", {}).get("code") if resp.status_code >= 400 else None
        out.append(
            Seen(
                sent,
                resp.status_code,
                code,
                resp.headers.get("x-should-retry"),
                resp.headers.get("x-holedger-call-id"),
            )
        )


async def one_round(env: Env, client: httpx.AsyncClient) -> None:
    run_id = env.ledger.open_run(make_terms(), task_digest=digest("task"))
    tokens = [
        env.tokens.issue_optimizer_token(run_id),
        env.tokens.issue_optimizer_token(run_id),
        env.trial_token("t-race", run_id=run_id),
    ]
    url = f"{env.base_url}/chat/completions"
    stop = asyncio.Event()
    seen: list[Seen] = []
    clients = [
        asyncio.create_task(hammer(client, url, tokens[i % len(tokens)], stop, seen))
        for i in range(CLIENTS)
    ]
    while len(seen) < WARM:  # every client is calling, and some calls are answered
        await asyncio.sleep(0.005)
    await asyncio.to_thread(env.ledger.close_run, run_id)
    closed_at = time.monotonic()
    while not any(s.sent > closed_at for s in seen):  # calls keep arriving after it
        await asyncio.sleep(0.005)
    stop.set()
    await asyncio.gather(*clients)

    after = [s for s in seen if s.sent > closed_at]
    assert after and all(s.status == 403 and s.code == "run_closed" for s in after)
    assert all(s.retry == "false" and s.call_id is None for s in after)
    assert env.gateway.flush(30)
    records = list(env.ledger.records(run_id))
    types = [r.type for r in records]
    assert types.count("RunClosed") == 1 and types[-2:] == ["RunClosed", "Checkpoint"]
    recorded = {r.payload["call_id"] for r in records if r.type == "GatewayCall"}
    answered = {s.call_id for s in seen if s.call_id is not None}
    assert answered <= recorded  # answered before the close: recorded before RunClosed
    refused = [s for s in seen if s.code == "run_closed"]
    assert all(s.call_id is None for s in refused)  # refused: nothing recorded
    report = replay_run(env.ledger, run_id)
    assert report.verified, report.failures[:3]


@pytest.mark.slow
def test_tokens_die_with_their_run_under_concurrent_calls(tmp_path: Path) -> None:
    env = open_env(f"sqlite:///{tmp_path / 'ledger.db'}", make_terms())
    try:

        async def main() -> None:
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                for _ in range(ROUNDS):
                    await one_round(env, client)

        asyncio.run(main())
        assert env.gateway.writer.failure is None
        assert env.gateway.writer.dropped_closed == 0  # nothing was left to drop
    finally:
        close_env(env)


def test_a_closed_run_refuses_tokens_calls_and_appends(tmp_path: Path) -> None:
    env = open_env(f"sqlite:///{tmp_path / 'ledger.db'}", make_terms())
    try:
        token = env.tokens.issue_optimizer_token(env.run_id)
        headers = {"authorization": f"Bearer {token}"}
        url = f"{env.base_url}/chat/completions"
        assert httpx.post(url, content=BODY, headers=headers, timeout=30).status_code == 200
        env.ledger.close_run(env.run_id)
        for path, method in ((url, "POST"), (f"{env.base_url}/models", "GET")):
            resp = httpx.request(method, path, content=BODY, headers=headers, timeout=30)
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "run_closed"
            assert resp.headers["x-should-retry"] == "false"
        with pytest.raises(RunClosedError):
            env.tokens.issue_optimizer_token(env.run_id)
        with pytest.raises(RunClosedError):
            env.ledger.append(env.run_id, "CandidateNominated", {"candidate": "0" * 40}, "server")
        assert env.ledger.is_closed(env.run_id)
        assert [r.state for r in env.ledger.runs()] == ["closed"]
        assert replay_run(env.ledger, env.run_id).verified
    finally:
        close_env(env)


def start_serve(home: Path) -> tuple[subprocess.Popen[str], str]:
    """``holedger serve`` in its own process; returns it and its gateway's base URL."""
    proc = subprocess.Popen(
        [*HOLEDGER, "--home", str(home), "serve", "--port", "0", "--gateway-port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    urls = json.loads(proc.stdout.readline())
    return proc, urls["gateway"][0]


def init_home(tmp_path: Path) -> Path:
    from holedger.cli import cli

    home = tmp_path / "home"
    assert CliRunner().invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    return home


def test_a_gateway_of_another_process_refuses_the_run_once_it_has_closed(
    tmp_path: Path,
) -> None:
    """The close waits until a gateway serving the ledger from another process (its own
    token cache) has seen it: a call sent after close_run returned is refused there too."""
    from holedger.config import Settings
    from holedger.gateway.tokens import TokenRegistry
    from holedger.ledger.store import Ledger

    home = init_home(tmp_path)
    ledger = Ledger.from_settings(Settings.resolve(str(home), None))
    run_id = ledger.open_run(make_terms(), task_digest=digest("task"))
    token = TokenRegistry(ledger.app.engine).issue_optimizer_token(run_id)
    proc, base = start_serve(home)
    try:
        headers = {"authorization": f"Bearer {token}"}
        url = f"{base}/chat/completions"
        assert httpx.post(url, content=BODY, headers=headers, timeout=30).status_code == 200
        ledger.close_run(run_id)
        resp = httpx.post(url, content=BODY, headers=headers, timeout=30)
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "run_closed"
        assert resp.headers["x-should-retry"] == "false"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)  # it stops on SIGTERM
    types = [r.type for r in ledger.records(run_id)]
    assert types[-2:] == ["RunClosed", "Checkpoint"] and types.count("GatewayCall") == 1
    assert replay_run(ledger, run_id).verified
    ledger.close()


def test_the_token_command_refuses_a_closed_run(tmp_path: Path) -> None:
    from holedger.cli import cli
    from holedger.config import Settings
    from holedger.ledger.store import Ledger

    runner = CliRunner()
    home = init_home(tmp_path)
    ledger = Ledger.from_settings(Settings.resolve(str(home), None))
    run_id = ledger.open_run(make_terms(), task_digest=digest("task"))
    ok = runner.invoke(cli, ["--home", str(home), "token", run_id])
    assert ok.exit_code == 0 and ok.output.startswith("hlg_")
    ledger.close_run(run_id)
    ledger.close()
    refused = runner.invoke(cli, ["--home", str(home), "token", run_id])
    assert refused.exit_code != 0
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert "closed" in lines[0] and "Traceback" not in refused.output
