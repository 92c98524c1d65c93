"""Every numeric field of every request shape is bounded before any arithmetic.

Property tests over real HTTP, for both scopes and every wire format the gateway serves
(Chat Completions, Responses, embeddings, Anthropic Messages and its count_tokens): any
integer from -2**200 to 2**200 (and any float, and the wrong kinds) in each bounded field
is either within its documented bound, and then the call is not refused for it, or
answered 400 naming the field and the bound, recorded, and never forwarded. The writer
never fails, and the run verifies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holedger.gateway.formats.anthropic import MESSAGES_BOUNDS
from holedger.gateway.formats.responses import RESPONSES_BOUNDS
from holedger.gateway.limits import CHAT_BOUNDS, MAX_OUTPUT_TOKENS, Bound
from holedger.replay.runs import replay_run

from .helpers import SIM_MODEL, CountingUpstream, Env, close_env, make_terms, open_env

MESSAGES = [{"role": "user", "content": "What was Acme's revenue in 2023?"}]
CHAT_BODY = {"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 8}
MESSAGES_BODY = {"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 8}
THINKING = (Bound("budget_tokens", 1, MAX_OUTPUT_TOKENS),)


@dataclass(frozen=True)
class Shape:
    """One request shape: its path, a valid body, and where its bounded fields sit."""

    path: str
    body: dict[str, Any]
    bounds: tuple[Bound, ...]
    nested: str | None = None  # the bounded fields sit in this member (an object)


SHAPES = {
    "chat": Shape("/chat/completions", CHAT_BODY, CHAT_BOUNDS),
    "responses": Shape(
        "/responses",
        {"model": SIM_MODEL, "input": "hi", "max_output_tokens": 16},
        RESPONSES_BOUNDS,
    ),
    "embeddings": Shape(
        "/embeddings", {"model": SIM_MODEL, "input": "hi"}, (Bound("dimensions", 1, 65536),)
    ),
    "messages": Shape("/messages", MESSAGES_BODY, MESSAGES_BOUNDS),
    "messages.thinking": Shape("/messages", MESSAGES_BODY, THINKING, nested="thinking"),
    "count_tokens": Shape("/messages/count_tokens", MESSAGES_BODY, MESSAGES_BOUNDS),
}
CASES = [(name, bound) for name, shape in SHAPES.items() for bound in shape.bounds]
BOUNDS = {bound.field: bound for bound in CHAT_BOUNDS}


class Probe:
    """One gateway serving one run over HTTP, for the whole module."""

    def __init__(self, env: Env, upstream: CountingUpstream) -> None:
        self.env = env
        self.upstream = upstream
        self.client = httpx.Client(timeout=30)
        self.tokens = {
            "target": env.trial_token("bounds"),
            "optimizer": env.tokens.issue_optimizer_token(env.run_id),
        }

    def post(
        self, scope: str, extra: dict[str, Any], shape: Shape = SHAPES["chat"]
    ) -> httpx.Response:
        if shape.nested is not None:
            extra = {shape.nested: {"type": "enabled", **extra}}
        body = {**shape.body, **extra}
        return self.client.post(
            f"{self.env.base_url}{shape.path}",
            content=json.dumps(body).encode(),
            headers={
                "authorization": f"Bearer {self.tokens[scope]}",
                "anthropic-version": "2023-06-01",
            },
        )


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    url = f"sqlite:///{tmp_path_factory.mktemp('bounds') / 'ledger.db'}"
    upstream = CountingUpstream()
    # A cap that holds any in-range request (n * max_tokens up to 2**31).
    env = open_env(url, make_terms(target_tokens=2**40), upstream_app=upstream)
    probe = Probe(env, upstream)
    yield probe
    probe.client.close()
    assert env.gateway.flush(30) and env.gateway.writer.failure is None
    close_env(env)


def in_range(value: Any, bound: Bound) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return not bound.whole and bound.low <= value <= bound.high
    return isinstance(value, int) and bound.low <= value <= bound.high


def check(probe: Probe, scope: str, shape: Shape, bound: Bound, value: Any) -> None:
    forwarded = len(probe.upstream.bodies)
    resp = probe.post(scope, {bound.field: value}, shape)
    if in_range(value, bound):  # not refused by the gateway (the upstream may refuse it)
        refused_here = resp.status_code == 400 and len(probe.upstream.bodies) == forwarded
        assert not refused_here, (shape.path, bound.field, value, resp.text)
        return
    assert resp.status_code == 400, (shape.path, bound.field, value, resp.status_code)
    error = resp.json()["error"]
    assert error.get("param", bound.field) == bound.field
    assert f"'{bound.field}' must be {bound.describe()}" in error["message"]
    assert resp.headers["x-should-retry"] == "false"
    assert len(probe.upstream.bodies) == forwarded  # nothing was forwarded


HUGE = st.integers(min_value=-(2**200), max_value=2**200)
NEAR = st.sampled_from([-1, 0, 1, 2, 20, 21, 128, 129, MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS + 1])
EDGES = st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**53, -(2**200)])
VALUES = st.one_of(
    HUGE,
    NEAR,
    EDGES,
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([True, False, "50", [1], {"a": 1}, 1.5, 0.5, -0.5, 2.0]),
)


@pytest.mark.parametrize("scope", ["target", "optimizer"])
@pytest.mark.parametrize(
    ("shape", "bound"), CASES, ids=[f"{name}.{bound.field}" for name, bound in CASES]
)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=VALUES)
def test_every_numeric_field_is_bounded_before_arithmetic(
    probe: Probe, scope: str, shape: str, bound: Bound, value: Any
) -> None:
    check(probe, scope, SHAPES[shape], bound, value)


def test_the_bound_is_named_in_the_refusal(probe: Probe) -> None:
    resp = probe.post("target", {"max_tokens": 2**64})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == (
        f"'max_tokens' must be an integer from 1 to {MAX_OUTPUT_TOKENS} (2**24)"
    )
    resp = probe.post("optimizer", {"n": -(2**200)})
    assert resp.status_code == 400 and "'n' must be an integer from 1 to 128" in resp.text


def test_the_run_verifies_after_every_probe(probe: Probe) -> None:
    env = probe.env
    assert env.gateway.flush(30) and env.gateway.writer.failure is None
    refused = [c for c in env.calls() if c.code == "invalid_request"]
    assert refused and all(not c.allowed and c.tokens.total == 0 for c in refused)
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id)
    assert report.verified, report.failures[:3]
