"""No call can stop the event writer: what a client or an upstream sends always fits an event.

An event that cannot be encoded (canonical JSON refuses lone surrogates and integers beyond
2**53) would be retried for ever, and the gateway would fail closed for every run it
serves. Each test sends such a value from one side, then checks that the call is refused
or recorded, that the writer has not failed, and that another trial's call still goes
through.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from holedger.gateway.budget import MAX_REPORTED_TOKENS

from .helpers import SIM_MODEL, Env, close_env, make_terms, open_env

MESSAGES = [{"role": "user", "content": "What was Acme's revenue in 2023?"}]


def post(env: Env, body: bytes, trial: str = "t1") -> httpx.Response:
    return httpx.post(
        f"{env.base_url}/chat/completions",
        content=body,
        headers={
            "authorization": f"Bearer {env.trial_token(trial)}",
            "content-type": "application/json",
        },
        timeout=10,
    )


def assert_still_serving(env: Env) -> None:
    assert env.gateway.flush(30)
    assert env.gateway.writer.failure is None
    body = json.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 20}).encode()
    assert post(env, body, trial="other").status_code != 503


def test_a_lone_surrogate_model_name_is_refused_and_the_writer_goes_on(env: Env) -> None:
    body = b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'
    resp = post(env, body)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "model"
    [call] = env.calls()
    assert call.code == "invalid_request" and not call.allowed
    assert_still_serving(env)


def test_too_deep_a_body_is_invalid_json(env: Env) -> None:
    resp = post(env, b"[" * 100_000 + b"]" * 100_000)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_json"
    assert_still_serving(env)


def answering(body: bytes) -> Any:
    """An upstream that answers every chat call with ``body``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body", False):
            pass
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


def completion(model: str, usage: str) -> bytes:
    return (
        '{"id":"x","object":"chat.completion","created":0,"model":"' + model + '",'
        '"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
        '"finish_reason":"stop"}],"usage":' + usage + "}"
    ).encode()


def test_an_upstream_model_name_with_a_lone_surrogate_is_recorded_escaped(
    sqlite_url: str,
) -> None:
    usage = '{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}'
    env = open_env(sqlite_url, make_terms(), upstream_app=answering(completion("m\\ud800", usage)))
    try:
        body = json.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 20}).encode()
        assert post(env, body).status_code == 200
        [call] = env.calls()
        assert call.model_reported == "m\\ud800" and call.tokens.total == 12
        assert_still_serving(env)
    finally:
        close_env(env)


def test_usage_beyond_belief_is_charged_the_reservation(sqlite_url: str) -> None:
    huge = MAX_REPORTED_TOKENS + 1
    usage = '{"prompt_tokens":' + str(2**60) + ',"completion_tokens":' + str(huge) + "}"
    env = open_env(sqlite_url, make_terms(), upstream_app=answering(completion("m", usage)))
    try:
        body = json.dumps({"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 20}).encode()
        resp = post(env, body)
        assert resp.status_code == 502  # not passed on: the client is told why
        assert resp.json()["error"]["code"] == "upstream_bad_usage"
        [call] = env.calls()
        assert call.usage_estimated and call.tokens.total == call.reserved
        assert_still_serving(env)
    finally:
        close_env(env)
