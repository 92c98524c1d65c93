"""Bad input in every wire format, from the client and from the upstream: each answered in
the format's own error shape (an Anthropic client gets an Anthropic error object), with
x-should-retry: false, recorded, and charged where it reached the budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from holedger.gateway.config import GatewayConfig, UpstreamConfig

from .helpers import SIM_MODEL, CountingUpstream, Env, close_env, make_terms, open_env

QUESTION = "What was the revenue of Acme Corp in Q2 2023?"
MESSAGES = [{"role": "user", "content": QUESTION}]


def post(env: Env, path: str, body: dict[str, Any], *, anthropic_style: bool = False) -> Any:
    token = env.trial_token()
    headers = (
        {"x-api-key": token, "anthropic-version": "2023-06-01"}
        if anthropic_style
        else {"authorization": f"Bearer {token}"}
    )
    url = env.base_url.removesuffix("/v1") + path
    return httpx.post(url, json=body, headers=headers, timeout=30)


def assert_anthropic_error(resp: httpx.Response, status: int, kind: str, code: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["error"]["code"] == code and body["error"]["message"]
    assert resp.headers["x-should-retry"] == "false"


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code
    assert resp.headers["x-should-retry"] == "false"


# ---------------------------------------------------------------------------- the client's


def test_messages_without_max_tokens_is_an_anthropic_400(
    env: Env, upstream: CountingUpstream
) -> None:
    resp = post(
        env, "/v1/messages", {"model": SIM_MODEL, "messages": MESSAGES}, anthropic_style=True
    )
    assert_anthropic_error(resp, 400, "invalid_request_error", "invalid_request")
    assert "max_tokens" in resp.json()["error"]["message"]
    assert upstream.bodies == []
    [call] = env.calls()
    assert not call.allowed and call.code == "invalid_request" and call.format == "messages"
    assert call.tokens.total == 0 and call.reservation_index is None


@pytest.mark.parametrize(
    ("path", "body", "anthropic_style"),
    [
        ("/v1/messages", {"model": SIM_MODEL, "max_tokens": 10, "messages": MESSAGES}, True),
        ("/v1/messages/count_tokens", {"model": SIM_MODEL, "messages": MESSAGES}, True),
        ("/v1/responses", {"model": SIM_MODEL, "input": QUESTION}, False),
        ("/v1/embeddings", {"model": SIM_MODEL, "input": QUESTION}, False),
        ("/v1/chat/completions", {"model": SIM_MODEL, "messages": MESSAGES}, False),
    ],
)
def test_a_body_over_the_size_limit_is_413_in_the_formats_shape(
    sqlite_url: str, path: str, body: dict[str, Any], anthropic_style: bool
) -> None:
    env = open_env(sqlite_url, make_terms(), GatewayConfig(max_body_bytes=2000))
    try:
        big = {**body, "metadata": {"pad": "x" * 4000}}
        resp = post(env, path, big, anthropic_style=anthropic_style)
        if anthropic_style:
            assert_anthropic_error(resp, 413, "request_too_large", "body_too_large")
        else:
            assert_openai_error(resp, 413, "body_too_large")
        [call] = env.calls()
        assert call.endpoint == path and call.status == 413 and call.tokens.total == 0
    finally:
        close_env(env)


IMAGE_URL = "https://example.com/q.png?leak=the-answer"


@pytest.mark.parametrize(
    ("path", "body", "kind"),
    [
        (
            "/v1/messages",
            {
                "max_tokens": 10,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": IMAGE_URL}}],
                    }
                ],
            },
            "web_fetch",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 10,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
                        ],
                    }
                ],
            },
            "files",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": IMAGE_URL}}],
                    }
                ]
            },
            "web_fetch",
        ),
        (
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_file", "file_url": IMAGE_URL}]}
                ]
            },
            "web_fetch",
        ),
        (
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}
                ]
            },
            "files",
        ),
    ],
)
def test_content_the_upstream_would_fetch_is_refused_unless_the_terms_allow_it(
    env: Env, upstream: CountingUpstream, path: str, body: dict[str, Any], kind: str
) -> None:
    """An image or file by URL makes the provider fetch from outside the run (and the URL
    can carry what the harness knows out); a file id brings in what the body does not
    hold. Both need the server tool, like a web_fetch tool; data in the body passes."""
    messages = path == "/v1/messages"
    resp = post(env, path, {"model": SIM_MODEL, **body}, anthropic_style=messages)
    if messages:
        assert_anthropic_error(resp, 403, "permission_error", "tool_not_allowed")
    else:
        assert_openai_error(resp, 403, "tool_not_allowed")
    assert repr(kind) in resp.text
    assert upstream.bodies == []
    [call] = env.calls()
    assert not call.allowed and call.code == "tool_not_allowed"


def test_an_image_carried_in_the_body_passes(env: Env, upstream: CountingUpstream) -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": [part]}]}
    resp = post(env, "/v1/chat/completions", body)
    assert resp.status_code != 403, resp.text
    assert len(upstream.bodies) == 1


@pytest.mark.parametrize(
    ("path", "body", "kind"),
    [
        ("/v1/responses", {"input": QUESTION, "tools": [{"type": "web_search"}]}, "web_search"),
        (
            "/v1/responses",
            {"input": QUESTION, "tools": [{"type": "mcp", "server_url": "x"}]},
            "mcp",
        ),
        (
            "/v1/responses",
            {"input": QUESTION, "tools": [{"type": "code_interpreter"}]},
            "code_interpreter",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 10,
                "messages": MESSAGES,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "web_search",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 10,
                "messages": MESSAGES,
                "tools": [{"type": "code_execution_20250825", "name": "code_execution"}],
            },
            "code_execution",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 10,
                "messages": MESSAGES,
                "mcp_servers": [{"type": "url", "url": "https://example.com/mcp", "name": "x"}],
            },
            "mcp",
        ),
        # Chat Completions: OpenAI's search models search the web for web_search_options,
        # an upstream runs a tool of a type other than function or custom, and an
        # OpenAI-compatible router runs its plugins (OpenRouter's "web" searches the web).
        ("/v1/chat/completions", {"messages": MESSAGES, "web_search_options": {}}, "web_search"),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "tools": [{"type": "web_search_preview"}]},
            "web_search_preview",
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "plugins": [{"id": "web"}]}, "web_search"),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "plugins": [{"id": "file-parser"}]},
            "file_parser",
        ),
    ],
)
def test_server_side_tools_are_refused_unless_the_terms_allow_them(
    env: Env, upstream: CountingUpstream, path: str, body: dict[str, Any], kind: str
) -> None:
    messages = path == "/v1/messages"
    resp = post(env, path, {"model": SIM_MODEL, **body}, anthropic_style=messages)
    if messages:
        assert_anthropic_error(resp, 403, "permission_error", "tool_not_allowed")
        message = resp.json()["error"]["message"]
    else:
        assert_openai_error(resp, 403, "tool_not_allowed")
        message = resp.json()["error"]["message"]
    assert repr(kind) in message
    assert upstream.bodies == []
    [call] = env.calls()
    assert not call.allowed and call.code == "tool_not_allowed"


@pytest.mark.parametrize(
    ("field", "value"),
    [("previous_response_id", "resp_1"), ("conversation", "conv_1"), ("models", ["a", "b"])],
)
def test_responses_fields_that_bring_unseen_context_or_models_are_refused(
    env: Env, upstream: CountingUpstream, field: str, value: Any
) -> None:
    resp = post(env, "/v1/responses", {"model": SIM_MODEL, "input": QUESTION, field: value})
    assert_openai_error(resp, 400, "invalid_request")
    assert resp.json()["error"]["param"] == field
    assert upstream.bodies == []


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/responses", "max_output_tokens", 2**64),
        ("/v1/responses", "max_output_tokens", 0),
        ("/v1/messages", "max_tokens", 2**64),
        ("/v1/messages", "max_tokens", True),
        ("/v1/embeddings", "dimensions", -1),
    ],
)
def test_numeric_fields_are_bounded_in_every_format(
    env: Env, upstream: CountingUpstream, path: str, field: str, value: Any
) -> None:
    body: dict[str, Any] = {"model": SIM_MODEL, "input": QUESTION}
    if path == "/v1/messages":
        body = {"model": SIM_MODEL, "max_tokens": 10, "messages": MESSAGES}
    resp = post(env, path, {**body, field: value}, anthropic_style=path == "/v1/messages")
    assert resp.status_code == 400 and field in resp.text
    assert upstream.bodies == []


def test_a_format_the_models_upstream_does_not_speak_is_refused(sqlite_url: str) -> None:
    config = GatewayConfig(
        upstream=UpstreamConfig(base_url="http://127.0.0.1:9/v1", provider="openai")
    )
    env = open_env(sqlite_url, make_terms(), config)
    try:
        body = {"model": SIM_MODEL, "max_tokens": 10, "messages": MESSAGES}
        resp = post(env, "/v1/messages", body, anthropic_style=True)
        assert_anthropic_error(resp, 400, "invalid_request_error", "format_not_served")
    finally:
        close_env(env)


# ---------------------------------------------------------------------------- the upstream's


def scripted(status: int, body: bytes, content_type: bytes = b"application/json") -> Any:
    """An upstream that answers every call with ``body`` (SSE events or JSON)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body", False):
            pass
        headers = [(b"content-type", content_type)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()
        for name, data in events
    )


@pytest.fixture
def scripted_env(sqlite_url: str, request: pytest.FixtureRequest) -> Iterator[Env]:
    env = open_env(sqlite_url, make_terms(), upstream_app=scripted(*request.param))
    yield env
    close_env(env)


MESSAGE_START = (
    "message_start",
    {
        "message": {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": SIM_MODEL,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }
    },
)
UNKNOWN_MESSAGES_EVENT = sse(
    MESSAGE_START,
    ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_surprise", {"index": 0}),
    ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
    ("message_stop", {}),
)
RESPONSE = {
    "id": "r",
    "object": "response",
    "model": SIM_MODEL,
    "output": [],
    "status": "completed",
}
UNKNOWN_RESPONSES_EVENT = sse(
    ("response.created", {"response": {**RESPONSE, "status": "in_progress"}}),
    ("mystery.event", {}),
    (
        "response.completed",
        {
            "response": {
                **RESPONSE,
                "usage": {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10},
            }
        },
    ),
)


@pytest.mark.parametrize(
    "scripted_env", [(200, UNKNOWN_MESSAGES_EVENT, b"text/event-stream")], indirect=True
)
def test_an_unknown_messages_event_ends_the_stream_with_an_anthropic_error(
    scripted_env: Env,
) -> None:
    env = scripted_env
    sdk = anthropic.Anthropic(
        base_url=env.base_url.removesuffix("/v1"), api_key=env.trial_token(), max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk.messages.stream(model=SIM_MODEL, max_tokens=50, messages=MESSAGES) as stream:  # type: ignore[arg-type]
            for _ in stream:
                pass
    assert "content_block_surprise" in str(caught.value)
    [call] = env.calls()
    assert call.allowed and call.usage_estimated and call.tokens.total == call.reserved
    assert "unknown event type 'content_block_surprise'" in (call.reason or "")


@pytest.mark.parametrize(
    "scripted_env", [(200, UNKNOWN_RESPONSES_EVENT, b"text/event-stream")], indirect=True
)
def test_an_unknown_responses_event_ends_the_stream_with_an_error(scripted_env: Env) -> None:
    env = scripted_env
    sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
    with pytest.raises(openai.APIError) as caught:
        for _ in sdk.responses.create(model=SIM_MODEL, input=QUESTION, stream=True):
            pass
    assert "mystery.event" in str(caught.value)
    [call] = env.calls()
    assert call.usage_estimated and call.tokens.total == call.reserved


BAD_RESPONSES_USAGE = json.dumps(
    {**RESPONSE, "usage": {"input_tokens": 5, "output_tokens": 5, "total_tokens": 99}}
).encode()
BAD_MESSAGES_USAGE = json.dumps(
    {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": SIM_MODEL,
        "content": [],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 5,
            "output_tokens": 5,
            "cache_creation_input_tokens": 10,
            "cache_creation": {"ephemeral_5m_input_tokens": 3},
        },
    }
).encode()
BAD_EMBEDDINGS_USAGE = json.dumps(
    {
        "object": "list",
        "data": [],
        "model": SIM_MODEL,
        "usage": {"prompt_tokens": 5, "total_tokens": 7},
    }
).encode()


@pytest.mark.parametrize(
    ("scripted_env", "path", "body"),
    [
        ((200, BAD_RESPONSES_USAGE), "/v1/responses", {"input": QUESTION}),
        ((200, BAD_MESSAGES_USAGE), "/v1/messages", {"max_tokens": 20, "messages": MESSAGES}),
        ((200, BAD_EMBEDDINGS_USAGE), "/v1/embeddings", {"input": QUESTION}),
    ],
    indirect=["scripted_env"],
)
def test_usage_that_does_not_add_up_is_charged_the_reservation_and_refused(
    scripted_env: Env, path: str, body: dict[str, Any]
) -> None:
    env = scripted_env
    messages = path == "/v1/messages"
    resp = post(env, path, {"model": SIM_MODEL, **body}, anthropic_style=messages)
    if messages:
        assert_anthropic_error(resp, 502, "api_error", "upstream_bad_usage")
    else:
        assert_openai_error(resp, 502, "upstream_bad_usage")
    [call] = env.calls()
    assert call.allowed and call.usage_estimated and call.tokens.total == call.reserved > 0
    assert "does not add up" in (call.reason or "")
