"""A trial's harness attacking the model gateway: calls that outlive their trial, output
limits that buy more than was reserved, and tokens or model names slipped past the checks.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from holedger.gateway.app import CallerBinding, TrialUsage
from holedger.gateway.wire import Receive, Scope, Send
from tests.gateway.helpers import (
    SIM_MODEL,
    CountingUpstream,
    Env,
    close_env,
    make_terms,
    open_env,
)

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def upstream() -> CountingUpstream:
    return CountingUpstream()


@pytest.fixture
def env(sqlite_url: str, upstream: CountingUpstream) -> Iterator[Env]:
    e = open_env(sqlite_url, make_terms(), upstream_app=upstream)
    yield e
    close_env(e)


def _chat(
    env: Env, body: dict[str, Any], headers: dict[str, str], path: str = ""
) -> httpx.Response:
    return httpx.post(
        f"{env.base_url}/chat/completions{path}", json=body, headers=headers, timeout=30
    )


def test_a_call_still_sending_its_body_when_the_trial_ends_is_refused_and_counted(
    env: Env, upstream: CountingUpstream
) -> None:
    """A harness starts a call, holds back the end of its body until its trial has ended,
    then finishes it: the call must not be forwarded on the dead token, and the trial's
    totals (TrialCompleted) must include it, or replay finds the totals wrong."""
    token = env.trial_token("t1")
    body = json.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 5}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    conn = socket.create_connection(("127.0.0.1", env.server.port), timeout=30)
    conn.sendall(head + body[:10])
    time.sleep(0.3)  # the gateway has checked the token and waits for the body
    closed: list[TrialUsage] = []
    closer = threading.Thread(
        target=lambda: closed.append(env.gateway.close_trial(env.run_id, "t1", wait_s=20))
    )
    closer.start()
    time.sleep(0.3)  # the trial is over (its token revoked) before the body ends
    conn.sendall(body[10:])
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(65536)
    conn.close()
    closer.join(30)
    status = int(answer.split(b" ", 2)[1])
    assert status == 403, answer[:300]
    assert upstream.bodies == []
    calls = [c for c in env.calls() if c.trial_id == "t1"]
    assert closed and closed[0].calls == len(calls) == 1
    assert closed[0].tokens == calls[0].tokens


class _BothLimitsUpstream:
    """An OpenAI-compatible upstream that, like common servers, honours
    ``max_completion_tokens or max_tokens`` and spends all of it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        body = json.loads(raw)
        self.bodies.append(body)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        answer = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": limit, "total_tokens": 5 + limit},
        }
        data = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": data})


def test_two_output_limits_cannot_buy_more_than_was_reserved(sqlite_url: str) -> None:
    """``max_tokens: 1`` with ``max_completion_tokens: 50000``: the reservation must cover
    whichever limit the upstream honours, so the cap can never be overshot."""
    upstream = _BothLimitsUpstream()
    env = open_env(sqlite_url, make_terms(target_tokens=5000), upstream_app=upstream)
    try:
        token = env.trial_token()
        body = {
            "model": SIM_MODEL,
            "messages": MESSAGES,
            "max_tokens": 1,
            "max_completion_tokens": 50_000,
        }
        for _ in range(3):
            _chat(env, body, {"authorization": f"Bearer {token}"})
        calls = env.calls()
        allowed = [c for c in calls if c.allowed]
        assert all(c.tokens.total <= c.reserved for c in allowed), [
            (c.reserved, c.tokens.total) for c in allowed
        ]
        assert sum(c.tokens.total for c in calls) <= 5000
        for sent in upstream.bodies:
            limits = [sent[k] for k in ("max_tokens", "max_completion_tokens") if k in sent]
            assert max(limits) == min(limits)
    finally:
        close_env(env)


def test_token_outside_the_authorization_header_is_not_accepted(
    env: Env, upstream: CountingUpstream
) -> None:
    token = env.trial_token()
    body = {"model": SIM_MODEL, "messages": MESSAGES}
    for headers, path in (
        ({}, f"?api_key={token}"),
        ({"authorization": f"Basic {token}"}, ""),
        ({"openai-api-key": token}, ""),
        ({"cookie": f"token={token}"}, ""),
    ):
        resp = _chat(env, body, headers, path)
        assert resp.status_code == 401, (headers, path, resp.text)
    assert upstream.bodies == []


@pytest.mark.parametrize(
    "model",
    [
        SIM_MODEL.upper(),
        f" {SIM_MODEL}",
        f"{SIM_MODEL}\n",
        SIM_MODEL.replace("e", "\u0435"),  # Cyrillic e
        SIM_MODEL.replace("-", "\u2010"),  # Unicode hyphen
        f"{SIM_MODEL}\u200b",  # zero-width space
        "sim-upstream",  # an alias's target, not in the allow-list
    ],
)
def test_model_name_tricks_are_refused(env: Env, upstream: CountingUpstream, model: str) -> None:
    resp = _chat(
        env,
        {"model": model, "messages": MESSAGES},
        {"authorization": f"Bearer {env.trial_token()}"},
    )
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "model_not_allowed"
    assert upstream.bodies == []


def test_pipelined_request_with_a_foreign_token_on_a_trial_socket_is_refused(
    env: Env, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """Two requests in one write on the trial's socket: the second carries another trial's
    token (header smuggling / pipelining). Each request is checked on its own."""
    path = tmp_path / "t1.sock"
    binding = CallerBinding(env.run_id, "target", "t1", "r1", "c1", 0)
    env.server.bind_unix(path, binding)
    own, other = env.trial_token("t1"), env.trial_token("t2")
    body = json.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 5}).encode()

    def request(token: str) -> bytes:
        return (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(str(path))
    conn.sendall(request(own) + request(other))
    data = b""
    while data.count(b"HTTP/1.1 ") < 2:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    conn.close()
    env.server.unbind_unix(path)
    statuses = [int(part.split(b" ", 1)[0]) for part in data.split(b"HTTP/1.1 ")[1:]]
    assert statuses[0] in (200, 429, 500, 502, 503) and statuses[1] == 403, statuses
    assert len(upstream.bodies) == 1
    refused = [c for c in env.calls() if c.code == "token_wrong_trial"]
    assert len(refused) == 1 and refused[0].trial_id == "t1"


class _RouterUpstream(_BothLimitsUpstream):
    """An upstream that, like model routers, serves the first of a request's ``models``
    (or ``fallbacks``) list when one is given."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def rewritten() -> Any:
            message = await receive()
            body = json.loads(message.get("body", b"{}"))
            switch = body.get("models") or body.get("fallbacks")
            if switch:
                body["model"] = switch[0]
            return {"type": "http.request", "body": json.dumps(body).encode()}

        await super().__call__(scope, rewritten, send)


@pytest.mark.parametrize("field", ["models", "fallbacks"])
def test_router_fields_cannot_pick_a_model_outside_the_allow_list(
    sqlite_url: str, field: str
) -> None:
    upstream = _RouterUpstream()
    env = open_env(sqlite_url, make_terms(), upstream_app=upstream)
    try:
        body = {"model": SIM_MODEL, field: ["gpt-expensive"], "messages": MESSAGES}
        resp = _chat(env, body, {"authorization": f"Bearer {env.trial_token()}"})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == field
        assert not upstream.bodies
    finally:
        close_env(env)
