"""A gateway stopped and closed holds no file descriptor: its event loop (epoll, eventfd,
io_uring, wake-up pipe), its listening socket and its ledger's connections are released
when it stops, not when the garbage collector finds them. A process that starts and stops
gateways (a server's runs, one after another) keeps a steady count."""

from __future__ import annotations

from itertools import count
from pathlib import Path

import httpx
from descriptors import descriptors_kept

from holedger.gateway.serve import AppServer
from holedger.gateway.sim_server import create_simulator_app

from .helpers import SIM_MODEL, CountingUpstream, close_env, make_terms, open_env

BODY = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def test_a_stopped_server_holds_no_descriptor() -> None:
    def step() -> None:
        with AppServer(create_simulator_app()) as server:
            assert httpx.get(f"{server.base_url}/models", timeout=30).status_code == 200

    assert descriptors_kept(step) == 0


def test_a_closed_gateway_and_its_ledger_hold_no_descriptor(tmp_path: Path) -> None:
    numbers = count()

    def step() -> None:
        env = open_env(
            f"sqlite:///{tmp_path / f'ledger{next(numbers)}.db'}",
            make_terms(),
            upstream_app=CountingUpstream(),
        )
        try:
            token = env.tokens.issue_optimizer_token(env.run_id)
            headers = {"authorization": f"Bearer {token}"}
            url = f"{env.base_url}/chat/completions"
            assert httpx.post(url, json=BODY, headers=headers, timeout=30).status_code == 200
            assert env.gateway.flush(30) and len(env.calls()) == 1
        finally:
            close_env(env)

    assert descriptors_kept(step) == 0
