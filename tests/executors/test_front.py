"""The way from a node to the gateway: a node's relay, TLS to the server's trial front
(a certificate the server made, pinned), then the trial's own gateway socket.

Real parts: the gateway with the simulator upstream, uvicorn on the trial's unix socket,
the front and relay over TCP and TLS on this machine. Each claim is attacked: a trial that
has ended, a wrong relay secret, a relay pinned to another certificate, an ended trial's
token through a running trial's route.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway.helpers import SIM_MODEL, CountingUpstream, Env, close_env, make_terms, open_env

from holedger.executors.relay import FrontAddress, NodeRelay, TrialFront
from holedger.executors.tls import make_identity
from holedger.gateway.app import CallerBinding

RUN_REQUEST = "req-0000000000000001"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    e = open_env(url, make_terms(), upstream_app=CountingUpstream())
    yield e
    close_env(e)


@pytest.fixture
def front() -> Iterator[TrialFront]:
    f = TrialFront("127.0.0.1")
    yield f
    f.stop()


def _trial(env: Env, tmp_path: Path, trial_id: str) -> tuple[str, Path]:
    """A trial's token and its gateway socket, which accepts only that token."""
    token = env.tokens.issue_trial_token(
        env.run_id, request_id=RUN_REQUEST, trial_id=trial_id, case_id="c1", attempt=0
    )
    folder = tmp_path / trial_id
    folder.mkdir()
    sock = folder / "gw.sock"
    binding = CallerBinding(env.run_id, "target", trial_id, RUN_REQUEST, "c1", 0)
    env.server.bind_unix(sock, binding)
    return token, sock


def _end(env: Env, front: TrialFront, trial_id: str, sock: Path) -> None:
    env.server.unbind_unix(sock)
    env.gateway.close_trial(env.run_id, trial_id)
    front.close(trial_id)


def _call(relay_sock: Path, token: str) -> httpx.Response:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(relay_sock)), timeout=30) as client:
        return client.post(
            "http://gateway/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {token}"},
        )


def test_a_running_trial_reaches_the_gateway_over_tls_and_is_refused_once_ended(
    env: Env, front: TrialFront, tmp_path: Path
) -> None:
    token, sock = _trial(env, tmp_path, f"{RUN_REQUEST}-0000")
    address = front.open(f"{RUN_REQUEST}-0000", sock)
    relay = NodeRelay(tmp_path / "node-a.sock", address)
    try:
        answer = _call(relay.path, token)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        # The trial ends: its token is revoked, its socket closed, its route at the front
        # closed. The same relay, the same token: refused at the front.
        _end(env, front, f"{RUN_REQUEST}-0000", sock)
        refused = _call(relay.path, token)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "trial_not_running"
    finally:
        relay.close()
    calls = env.calls()
    assert len(calls) == 1 and calls[0].allowed and calls[0].trial_id == f"{RUN_REQUEST}-0000"


def test_an_ended_trials_token_through_a_running_trials_route_is_refused_and_recorded(
    env: Env, front: TrialFront, tmp_path: Path
) -> None:
    old_token, old_sock = _trial(env, tmp_path, f"{RUN_REQUEST}-0000")
    _end(env, front, f"{RUN_REQUEST}-0000", old_sock)
    _token, sock = _trial(env, tmp_path, f"{RUN_REQUEST}-0001")
    relay = NodeRelay(tmp_path / "node-b.sock", front.open(f"{RUN_REQUEST}-0001", sock))
    try:
        refused = _call(relay.path, old_token)
    finally:
        relay.close()
    assert refused.status_code == 403, refused.text
    (call,) = env.calls()
    assert not call.allowed and call.trial_id == f"{RUN_REQUEST}-0001"
    assert call.code is not None and call.code.startswith("token_")


def test_a_wrong_relay_secret_is_refused_at_the_front(
    env: Env, front: TrialFront, tmp_path: Path
) -> None:
    token, sock = _trial(env, tmp_path, f"{RUN_REQUEST}-0000")
    real = front.open(f"{RUN_REQUEST}-0000", sock)
    forged = FrontAddress(
        real.host, real.port, real.cert_pem, real.fingerprint, real.trial_id, "0" * 64
    )
    relay = NodeRelay(tmp_path / "node.sock", forged)
    try:
        refused = _call(relay.path, token)
    finally:
        relay.close()
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "trial_not_running"
    assert env.calls() == []  # nothing reached the gateway
    assert front.refused == 1


def test_a_relay_pinned_to_another_certificate_never_sends(
    env: Env, front: TrialFront, tmp_path: Path
) -> None:
    token, sock = _trial(env, tmp_path, f"{RUN_REQUEST}-0000")
    real = front.open(f"{RUN_REQUEST}-0000", sock)
    other = make_identity("127.0.0.1")
    pinned_elsewhere = FrontAddress(
        real.host, real.port, other.cert_pem, other.fingerprint, real.trial_id, real.secret
    )
    relay = NodeRelay(tmp_path / "node.sock", pinned_elsewhere)
    try:
        with pytest.raises(httpx.HTTPError):
            _call(relay.path, token)
    finally:
        relay.close()
    assert env.calls() == []
    # and plain TCP without TLS gets nothing from the front either
    with pytest.raises((ssl.SSLError, httpx.HTTPError)):
        httpx.get(f"http://127.0.0.1:{front.port}/v1/models", timeout=5)
