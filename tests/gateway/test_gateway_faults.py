"""A fault of the gateway's own (an unexpected exception) still leaves one GatewayCall.

Each test breaks one step of a call by patching it to raise, then checks what the client
got (a 500 ``gateway_error`` it is told not to retry, or an error event ending a stream),
what the ledger holds (exactly one event for the call, charged as the rules say), that the
run's budget holds no reservation afterwards, and that replay still verifies the run.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from holedger.gateway import app as gateway_app
from holedger.gateway.app import Gateway
from holedger.gateway.recorder import EventWriter, Submission
from holedger.replay.engine import replay_run
from holedger.replay.gateway_checks import GatewayProjection
from holedger.schemas.events import SafetyViolation

from .helpers import SIM_MODEL, CountingUpstream, Env, trial_completed

MESSAGES = [{"role": "user", "content": "What was Acme's revenue in 2023?"}]


class Boom(RuntimeError):
    """The injected fault."""


def boom(*args: Any, **kwargs: Any) -> Any:
    raise Boom("injected")


def chat(env: Env, token: str, **extra: Any) -> httpx.Response:
    body = {"model": SIM_MODEL, "messages": MESSAGES, "max_tokens": 40, **extra}
    return httpx.post(
        f"{env.base_url}/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=10,
    )


def assert_gateway_error(resp: httpx.Response) -> None:
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert error["code"] == "gateway_error" and error["type"] == "server_error"
    assert "Boom" in error["message"]
    assert resp.headers["x-should-retry"] == "false"
    assert resp.headers["x-holedger-call-id"]


def outstanding(env: Env) -> int:
    return env.gateway._run_state(env.run_id).budget.outstanding


def assert_replay_verifies(env: Env, trial_id: str = "t1") -> None:
    completed = trial_completed(env, trial_id)
    env.ledger.append(env.run_id, "TrialCompleted", completed, "server")
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id, projections=[GatewayProjection])
    assert report.verified, report.failed_checks()


def test_a_fault_before_forwarding_is_a_recorded_denial(
    env: Env, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Gateway, "_rewrite", boom)
    resp = chat(env, env.trial_token())
    assert_gateway_error(resp)
    [call] = env.calls()
    assert call.call_id == resp.headers["x-holedger-call-id"]
    assert not call.allowed and call.status == 500 and call.code == "gateway_error"
    assert call.trial_id == "t1" and call.tokens.total == 0
    assert call.reservation_index is None
    assert upstream.bodies == []  # nothing forwarded
    assert_replay_verifies(env)


def test_a_fault_after_reserving_but_before_forwarding_settles_at_zero(
    env: Env, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Gateway, "_forward", boom)
    resp = chat(env, env.trial_token())
    assert_gateway_error(resp)
    [call] = env.calls()
    assert call.allowed and call.status == 500 and call.reservation_index == 0
    assert call.tokens.total == 0 and not call.usage_estimated
    assert outstanding(env) == 0  # the reservation did not leak
    assert upstream.bodies == []
    assert_replay_verifies(env)


def test_a_fault_after_the_upstream_answered_charges_the_reservation(
    env: Env, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_app, "usage_from_openai", boom)
    resp = chat(env, env.trial_token())
    assert_gateway_error(resp)
    [call] = env.calls()
    assert call.allowed and call.status == 500 and call.usage_estimated
    assert call.tokens.total == call.reserved > 0  # the upstream may have done the work
    assert call.reason == "gateway error: Boom"
    assert len(upstream.bodies) == 1
    assert outstanding(env) == 0
    usage = env.gateway.trial_usage(env.run_id, "t1")
    assert usage.calls == 1 and usage.tokens.total == call.reserved
    assert_replay_verifies(env)


def test_a_fault_mid_stream_ends_the_stream_and_charges_the_reservation(
    env: Env, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The response has begun (its head is sent) before the first chunk is fed.
    monkeypatch.setattr(gateway_app._StreamPump, "feed", boom)
    resp = chat(env, env.trial_token(), stream=True)
    assert resp.status_code == 200  # the stream had begun when the fault came
    events = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "gateway_error"
    [call] = env.calls()
    assert call.allowed and call.stream and call.usage_estimated
    assert call.tokens.total == call.reserved
    assert call.reason == "gateway error: Boom"
    assert outstanding(env) == 0
    assert_replay_verifies(env)


def test_a_fault_listing_models_is_recorded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Gateway, "_allowed_models", boom)
    resp = httpx.get(
        f"{env.base_url}/models",
        headers={"authorization": f"Bearer {env.trial_token()}"},
        timeout=10,
    )
    assert_gateway_error(resp)
    [call] = env.calls()
    assert not call.allowed and call.status == 500 and call.endpoint == "/v1/models"


def test_the_sdk_does_not_retry_a_gateway_error(
    env: Env, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_app, "usage_from_openai", boom)
    sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=2)
    with pytest.raises(openai.InternalServerError):
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=40)
    assert len(env.calls()) == 1 and len(upstream.bodies) == 1  # charged once, sent once


def test_the_gateway_serves_on_after_a_fault(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(Gateway, "_rewrite", boom)
        assert chat(env, env.trial_token()).status_code == 500
    resp = chat(env, env.trial_token())
    assert resp.status_code in (200, 500, 503)  # the simulator fails a few calls itself
    assert len(env.calls()) == 2
    assert env.gateway.writer.failure is None


def test_a_writer_closed_while_failing_counts_its_unwritten_events_as_unwritten(
    env: Env,
) -> None:
    # Closing gives up on a ledger that cannot be written; what it gave up must not be
    # reported as written (flush, the room and the backlog all read that count).
    writer = EventWriter(env.ledger, linger_s=0.0)
    with env.ledger.app.engine.begin() as conn:  # break the events table under the writer
        conn.exec_driver_sql("ALTER TABLE holedger_events RENAME TO holedger_events_away")
    try:
        violation = SafetyViolation(category="test", detail="unwritable")
        writer.submit(Submission(env.run_id, events=[("SafetyViolation", violation, "gateway")]))
        writer.close(timeout=0.5)
        assert writer.failure is not None
        assert writer.written == 0 and writer.backlog == 1 and writer.lost == 1
        assert not writer.flush(0.1)
    finally:
        with env.ledger.app.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE holedger_events_away RENAME TO holedger_events")
