"""What the run's terms may allow beyond the model: server-side tools, model-switching
fields and the anthropic-beta header. Each is refused (in the format's own error shape,
recorded) unless ``TaskTerms.server_tools`` names it, and forwarded when it does; a metered
count_tokens call is refused once the budget cannot hold its prompt. Replay checks every
one of these runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from pydantic import ValidationError
from sample_terms import task_terms

from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.runs import replay_run
from holedger.schemas.events import SafetyViolation
from holedger.schemas.task import TaskSpec
from holedger.tasks import load_task
from holedger.tasks.digests import task_digest

from .helpers import SIM_MODEL, CountingUpstream, Env, close_env, open_env

QUESTION = "What was the revenue of Acme Corp in Q2 2023?"
MESSAGES = [{"role": "user", "content": QUESTION}]
UNLISTED = "gpt-unlisted"


class HeaderUpstream(CountingUpstream):
    """The counting simulator, keeping the request headers it was sent as well."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.headers.append(dict(scope["headers"]))
        await super().__call__(scope, receive, send)


def terms_env(url: str, upstream: CountingUpstream, *allowed: str, tokens: int = 10**6) -> Env:
    terms = task_terms(
        "terms-test",
        models=[SIM_MODEL, "alias-model"],
        target_tokens=tokens,
        immutable_paths=[],
        server_tools=sorted(allowed) or None,
    )
    return open_env(url, terms, upstream_app=upstream)


@pytest.fixture
def upstream() -> HeaderUpstream:
    return HeaderUpstream()


@pytest.fixture
def make(sqlite_url: str, upstream: HeaderUpstream) -> Iterator[Any]:
    opened: list[Env] = []

    def build(*allowed: str, tokens: int = 10**6) -> Env:
        env = terms_env(sqlite_url, upstream, *allowed, tokens=tokens)
        opened.append(env)
        return env

    yield build
    for env in opened:
        close_env(env)


def post(env: Env, path: str, body: dict[str, Any], beta: str | None = None) -> httpx.Response:
    token = env.trial_token()
    if path.startswith("/v1/messages"):
        headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
        if beta is not None:
            headers["anthropic-beta"] = beta
    else:
        headers = {"authorization": f"Bearer {token}"}
    url = env.base_url.removesuffix("/v1") + path
    return httpx.post(url, json={"model": SIM_MODEL, **body}, headers=headers, timeout=30)


def error_code(path: str, resp: httpx.Response) -> str:
    body = resp.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error", body  # the Anthropic error object
        return str(body["error"]["code"])
    return str(body["error"]["code"])


def replays(env: Env) -> None:
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
    assert report.verified, report.failed_checks()


MSG = {"max_tokens": 20, "messages": MESSAGES}
# (path, body, the server_tools name that allows it)
SERVER_TOOLS = [
    ("/v1/responses", {"input": QUESTION, "tools": [{"type": "web_search"}]}, "web_search"),
    (
        "/v1/responses",
        {"input": QUESTION, "tools": [{"type": "mcp", "server_label": "x"}]},
        "mcp",
    ),
    (
        "/v1/messages",
        {**MSG, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "web_search",
    ),
    (
        "/v1/messages",
        {**MSG, "tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
        "code_execution",
    ),
    (
        "/v1/messages",
        {**MSG, "mcp_servers": [{"type": "url", "url": "https://example.com/m", "name": "m"}]},
        "mcp",
    ),
    ("/v1/messages/count_tokens", {**MSG, "tools": [{"type": "web_fetch_20250910"}]}, "web_fetch"),
    (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 20, "web_search_options": {}},
        "web_search",
    ),
    (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 20, "plugins": [{"id": "web"}]},
        "web_search",
    ),
]


@pytest.mark.parametrize(("path", "body", "tool"), SERVER_TOOLS)
def test_a_server_side_tool_passes_only_when_the_terms_name_it(
    make: Any, upstream: HeaderUpstream, path: str, body: dict[str, Any], tool: str
) -> None:
    other = make("image_generation")  # allowing one tool allows no other
    refused = post(other, path, body)
    assert refused.status_code == 403 and error_code(path, refused) == "tool_not_allowed"
    assert refused.headers["x-should-retry"] == "false"
    assert upstream.bodies == []
    [call] = other.calls()
    assert not call.allowed and call.code == "tool_not_allowed"
    replays(other)

    env = make(tool)
    resp = post(env, path, body)
    assert resp.status_code != 403, resp.text  # whatever the upstream made of it
    assert len(upstream.bodies) == 1 and upstream.bodies[0]["model"] == SIM_MODEL
    [call] = env.calls()
    assert call.allowed and call.code is None and call.reservation_index == 0
    replays(env)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 20}),
        ("/v1/responses", {"input": QUESTION, "max_output_tokens": 20}),
        ("/v1/embeddings", {"input": QUESTION}),
        ("/v1/messages", MSG),
    ],
)
def test_model_switching_fields_need_the_terms_and_listed_models(
    make: Any, upstream: HeaderUpstream, path: str, body: dict[str, Any]
) -> None:
    env = make()
    refused = post(env, path, {**body, "models": ["alias-model"]})
    assert refused.status_code == 400 and error_code(path, refused) == "invalid_request"
    assert upstream.bodies == []

    env = make("model_switch")
    allowed = post(env, path, {**body, "fallbacks": ["alias-model"]})
    assert allowed.status_code < 400 or allowed.status_code >= 500, allowed.text
    assert upstream.bodies[-1]["fallbacks"] == ["alias-model"]
    unlisted = post(env, path, {**body, "models": ["alias-model", UNLISTED]})
    assert unlisted.status_code == 403 and error_code(path, unlisted) == "model_not_allowed"
    assert UNLISTED in unlisted.text
    malformed = post(env, path, {**body, "models": [{"model": SIM_MODEL}]})
    assert malformed.status_code == 400 and error_code(path, malformed) == "invalid_request"
    assert len(upstream.bodies) == 1
    first, second, third = env.calls()
    assert first.allowed and first.model_requested == SIM_MODEL
    # The refused name is recorded as the model asked for, with a SafetyViolation.
    assert not second.allowed and second.model_requested == UNLISTED
    assert second.code == "model_not_allowed" and not third.allowed
    records = [r.typed_payload() for r in env.ledger.records(env.run_id)]
    assert any(
        isinstance(p, SafetyViolation) and p.category == "model_not_allowed" for p in records
    )
    replays(env)


def test_anthropic_betas_that_reach_outside_need_the_terms(
    make: Any, upstream: HeaderUpstream
) -> None:
    env = make()
    harmless = "prompt-caching-2024-07-31, token-efficient-tools-2025-02-19"
    ok = post(env, "/v1/messages", MSG, beta=harmless)
    assert ok.status_code in (200, 500, 502, 503), ok.text
    assert upstream.headers[-1][b"anthropic-beta"] == (
        b"prompt-caching-2024-07-31,token-efficient-tools-2025-02-19"
    )
    for beta in ("mcp-client-2025-04-04", "prompt-caching-2024-07-31,web-fetch-2025-09-10"):
        refused = post(env, "/v1/messages", MSG, beta=beta)
        assert refused.status_code == 403, refused.text
        assert error_code("/v1/messages", refused) == "beta_not_allowed"
        assert refused.json()["error"]["type"] == "permission_error"
    unknown = post(env, "/v1/messages/count_tokens", MSG, beta="brand-new-thing-2031-01-01")
    assert unknown.status_code == 403 and "brand-new-thing" in unknown.text
    # The anthropic SDK raises its own error type for it, and does not retry it.
    sdk = anthropic.Anthropic(
        base_url=env.base_url.removesuffix("/v1"), api_key=env.trial_token(), max_retries=3
    )
    with pytest.raises(anthropic.PermissionDeniedError):
        sdk.messages.create(
            model=SIM_MODEL,
            max_tokens=20,
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_headers={"anthropic-beta": "code-execution-2025-08-25"},
        )
    assert len(upstream.bodies) == 1
    codes = [c.code for c in env.calls()]
    assert codes[1:] == ["beta_not_allowed"] * 4
    replays(env)

    allowed = make("mcp")
    resp = post(allowed, "/v1/messages", MSG, beta="mcp-client-2025-04-04")
    assert resp.status_code != 403, resp.text
    assert upstream.headers[-1][b"anthropic-beta"] == b"mcp-client-2025-04-04"
    replays(allowed)


def test_count_tokens_is_refused_once_the_budget_cannot_hold_its_prompt(make: Any) -> None:
    env = make(tokens=400)
    big = [{"role": "user", "content": QUESTION + " " + "x" * 600}]
    sdk = anthropic.Anthropic(
        base_url=env.base_url.removesuffix("/v1"), api_key=env.trial_token(), max_retries=3
    )
    small = sdk.messages.count_tokens(model=SIM_MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert small.input_tokens > 0
    with pytest.raises(anthropic.APIStatusError) as refused:
        sdk.messages.count_tokens(model=SIM_MODEL, messages=big)  # type: ignore[arg-type]
    assert refused.value.status_code == 402
    assert refused.value.body["error"]["type"] == "billing_error"  # type: ignore[index]
    first, second = env.calls()
    assert first.allowed and first.tokens.total == 0 and first.reservation_index == 0
    assert not second.allowed and second.code == "budget_exhausted"
    assert second.reserved > 400 and second.budget is not None
    assert second.budget.settled_calls == 1
    replays(env)


def test_the_bundled_task_allows_nothing_beyond_its_models() -> None:
    terms = load_task("officeqa-lite").terms()
    assert terms.server_tools is None
    assert "server_tools" not in terms.model_dump(mode="json")  # old logs' form kept


def test_a_task_names_its_server_tools_and_a_task_without_keeps_its_digest() -> None:
    task = load_task("officeqa-lite")
    spec = task.spec.model_copy(update={"server_tools": ["web_search", "mcp", "web_search"]})
    assert spec.terms().server_tools == ["mcp", "web_search"]
    assert task_digest(spec) != task.digest
    none = task.spec.model_copy(update={"server_tools": []})
    assert task_digest(none) == task.digest  # an empty list is left out of the spec
    with pytest.raises(ValidationError):
        TaskSpec.model_validate({**task.spec.model_dump(), "server_tools": ["Web Search"]})
