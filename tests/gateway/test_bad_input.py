"""Bad input: the right status and OpenAI error body, nothing forwarded, the decision recorded."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from holedger.gateway.config import GatewayConfig
from holedger.schemas.events import SafetyViolation

from .helpers import SIM_MODEL, CountingUpstream, Env, close_env, make_terms, open_env

MESSAGES = [{"role": "user", "content": "hello"}]


def post(
    env: Env, content: bytes, token: str | None, path: str = "/chat/completions"
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx.post(f"{env.base_url}{path}", content=content, headers=headers, timeout=10)


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    assert resp.headers["x-should-retry"] == "false"


def test_malformed_json_is_400_recorded_and_not_forwarded(
    env: Env, upstream: CountingUpstream
) -> None:
    resp = post(env, b'{"model": "holedger-sim-1", "messages": [', env.trial_token())
    assert_openai_error(resp, 400, "invalid_json")
    (event,) = env.calls()
    assert not event.allowed and event.status == 400 and event.trial_id == "t1"
    assert event.request_digest is not None
    assert upstream.bodies == []


def test_a_chat_body_without_messages_is_400(env: Env, upstream: CountingUpstream) -> None:
    resp = post(env, b'{"model": "holedger-sim-1"}', env.trial_token())
    assert_openai_error(resp, 400, "invalid_request")
    assert resp.json()["error"]["param"] == "messages"
    assert upstream.bodies == []


@pytest.mark.parametrize(
    "extra",
    ['"max_tokens": 0', '"max_tokens": -5', '"max_completion_tokens": "50"', '"n": 0', '"n": 1.5'],
)
def test_a_limit_the_upstream_could_read_as_unlimited_is_400(
    env: Env, upstream: CountingUpstream, extra: str
) -> None:
    body = '{"model":"holedger-sim-1","messages":[{"role":"user","content":"hi"}],' + extra + "}"
    resp = post(env, body.encode(), env.trial_token())
    assert_openai_error(resp, 400, "invalid_request")
    assert upstream.bodies == []


def test_body_over_the_size_cap_is_413(sqlite_url: str) -> None:
    upstream = CountingUpstream()
    env = open_env(sqlite_url, make_terms(), GatewayConfig(max_body_bytes=2048), upstream)
    try:
        big = b'{"model":"holedger-sim-1","messages":[{"role":"user","content":"' + b"x" * 4096
        big += b'"}]}'
        resp = post(env, big, env.trial_token())
        assert_openai_error(resp, 413, "body_too_large")
        (event,) = env.calls()
        assert event.status == 413 and not event.allowed
        assert upstream.bodies == []
    finally:
        close_env(env)


def test_missing_and_unknown_tokens_are_401_and_not_forwarded(
    env: Env, upstream: CountingUpstream
) -> None:
    body = b'{"model":"holedger-sim-1","messages":[{"role":"user","content":"hi"}]}'
    assert_openai_error(post(env, body, None), 401, "missing_token")
    assert_openai_error(post(env, body, "hlg_" + "A" * 43), 401, "invalid_token")
    assert_openai_error(post(env, body, "sk-not-ours"), 401, "invalid_token")
    sdk = openai.OpenAI(base_url=env.base_url, api_key="hlg_forged")
    with pytest.raises(openai.AuthenticationError):
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
    assert upstream.bodies == []
    assert env.calls() == []  # nothing to attribute them to


def test_unknown_model_is_403_with_a_safety_violation(env: Env, upstream: CountingUpstream) -> None:
    sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
    with pytest.raises(openai.PermissionDeniedError) as info:
        sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.response.json()["error"]["code"] == "model_not_allowed"
    assert upstream.bodies == []
    (event,) = env.calls()
    assert event.model_requested == "gpt-4o" and event.model_served is None
    assert env.types().count("SafetyViolation") == 1
    (violation,) = [
        r.typed_payload() for r in env.ledger.records(env.run_id) if r.type == "SafetyViolation"
    ]
    assert isinstance(violation, SafetyViolation)
    assert violation.category == "model_not_allowed" and violation.call_id == event.call_id
    assert violation.evidence_digest and env.ledger.has_blob(violation.evidence_digest)


def test_allow_list_is_exact_no_prefix_or_case_variant(env: Env) -> None:
    sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
    for name in ("holedger-sim-1 ", "HOLEDGER-SIM-1", "holedger-sim-1x", "holedger-sim-*", "*"):
        with pytest.raises(openai.PermissionDeniedError):
            sdk.chat.completions.create(model=name, messages=MESSAGES)


@pytest.fixture
def aliased(sqlite_url: str) -> Iterator[tuple[Env, CountingUpstream]]:
    upstream = CountingUpstream()
    config = GatewayConfig(aliases={"alias-model": SIM_MODEL, "secret-model": SIM_MODEL})
    env = open_env(sqlite_url, make_terms(), config, upstream)
    yield env, upstream
    close_env(env)


def test_alias_resolved_after_the_check_and_both_names_recorded(
    aliased: tuple[Env, CountingUpstream],
) -> None:
    env, upstream = aliased
    sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
    sdk.chat.completions.create(model="alias-model", messages=MESSAGES)
    assert upstream.bodies[-1]["model"] == SIM_MODEL
    (event,) = env.calls()
    assert event.model_requested == "alias-model" and event.model_served == SIM_MODEL
    # An alias does not widen the allow-list: "secret-model" is not in it.
    with pytest.raises(openai.PermissionDeniedError):
        sdk.chat.completions.create(model="secret-model", messages=MESSAGES)
    assert len(upstream.bodies) == 1


def test_empty_allow_list_allows_nothing(sqlite_url: str) -> None:
    terms = make_terms().model_copy(update={"models": []})
    upstream = CountingUpstream()
    env = open_env(sqlite_url, terms, upstream_app=upstream)
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
        with pytest.raises(openai.PermissionDeniedError):
            sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert list(sdk.models.list()) == []
        assert upstream.bodies == []
    finally:
        close_env(env)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/completions"),
        ("POST", "/v1/audio/speech"),
        ("GET", "/v1/chat/completions"),
        ("GET", "/"),
    ],
)
def test_non_chat_endpoints_are_404_in_the_openai_shape(
    env: Env, upstream: CountingUpstream, method: str, path: str
) -> None:
    url = env.base_url.removesuffix("/v1") + path
    headers = {"authorization": f"Bearer {env.trial_token()}"}
    resp = httpx.request(method, url, headers=headers, json={"model": SIM_MODEL}, timeout=10)
    assert_openai_error(resp, 404, "unknown_endpoint")
    assert upstream.bodies == []
    (event,) = env.calls()  # the trial's token vouches for the caller: recorded
    assert event.endpoint == path and event.status == 404 and not event.allowed


def test_non_chat_endpoint_without_a_token_is_404_and_unrecorded(env: Env) -> None:
    resp = httpx.post(env.base_url + "/completions", json={}, timeout=10)
    assert_openai_error(resp, 404, "unknown_endpoint")
    assert env.calls() == []


def test_a_lone_surrogate_escape_is_forwarded_escaped_and_recorded(
    env: Env, upstream: CountingUpstream
) -> None:
    # JSON may spell a lone surrogate ("\ud800"); it has no UTF-8 form, so the gateway
    # forwards it as the same escape instead of failing the call without an event.
    body = b'{"model": "holedger-sim-1", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    resp = post(env, body, env.trial_token())
    assert resp.status_code == 200, resp.text
    assert upstream.bodies[-1]["messages"][0]["content"] == "a\ud800b"
    [call] = env.calls()
    assert call.allowed and call.status == 200 and call.request_digest is not None


def test_a_token_for_a_run_the_ledger_lacks_is_403_unknown_run_and_not_recorded(
    env: Env, upstream: CountingUpstream
) -> None:
    import uuid

    missing = str(uuid.uuid4())
    body = b'{"model": "holedger-sim-1", "messages": [{"role": "user", "content": "hi"}]}'
    resp = post(env, body, env.trial_token(run_id=missing))
    assert_openai_error(resp, 403, "unknown_run")
    assert resp.json()["error"]["type"] == "permission_error"
    assert upstream.bodies == []
    assert env.calls() == [] and env.calls(missing) == []
