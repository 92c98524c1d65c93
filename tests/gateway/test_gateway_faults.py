"""A fault of the gateway's own (an unexpected exception) still leaves one GatewayCall.

Each test breaks one step of a call by patching it to raise, then checks what the client
got (a 500 ``gateway_error`` it is told not to retry, or an error event ending a stream),
what the ledger holds (exactly one event for the call, charged as the rules say), that the
run's budget holds no reservation afterwards, and that replay still verifies the run.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import openai
import pytest

from holedger.gateway.admission import Admission
from holedger.gateway.call_events import CallRecorder
from holedger.gateway.formats.base import SsePump
from holedger.gateway.formats.chat import ChatFormat
from holedger.gateway.forwarding import Forwarder
from holedger.gateway.recorder import EventRoom, EventWriter, Submission
from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.runs import replay_run
from holedger.schemas.events import SafetyViolation

from .helpers import (
    SIM_MODEL,
    CountingUpstream,
    Env,
    close_env,
    make_terms,
    open_env,
    trial_completed,
)

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
    return env.gateway.metering.run_state(env.run_id).budget.outstanding


def assert_replay_verifies(env: Env, trial_id: str = "t1") -> None:
    completed = trial_completed(env, trial_id)
    env.ledger.append(env.run_id, "TrialCompleted", completed, "server")
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
    assert report.verified, report.failed_checks()


def test_a_fault_before_forwarding_is_a_recorded_denial(
    env: Env, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ChatFormat, "rewrite", boom)
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
    monkeypatch.setattr(Forwarder, "forward", boom)
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
    monkeypatch.setattr(ChatFormat, "usage", boom)
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
    monkeypatch.setattr(SsePump, "feed", boom)
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
    monkeypatch.setattr(Admission, "allowed_models", boom)
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
    monkeypatch.setattr(ChatFormat, "usage", boom)
    sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=2)
    with pytest.raises(openai.InternalServerError):
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=40)
    assert len(env.calls()) == 1 and len(upstream.bodies) == 1  # charged once, sent once


def test_the_gateway_serves_on_after_a_fault(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(ChatFormat, "rewrite", boom)
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
        # Nobody will write them now: a flush says so at once rather than wait forever.
        answers: list[bool] = []
        waiter = threading.Thread(target=lambda: answers.append(writer.flush(None)), daemon=True)
        waiter.start()
        waiter.join(10)
        assert answers == [False]
    finally:
        with env.ledger.app.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE holedger_events_away RENAME TO holedger_events")


def test_a_fault_while_recording_a_settlement_still_leaves_one_event(
    env: Env, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The settlement's own recording fails once: the reservation must still stand, so the
    # fault handler settles and records the call once (charged its reservation).
    record = CallRecorder.record
    failed: list[str] = []

    def fail_first_settlement(self: CallRecorder, call: Any, **kw: Any) -> None:
        if kw.get("status") == 200 and not failed:
            failed.append(call.call_id)
            raise Boom("injected")
        record(self, call, **kw)

    monkeypatch.setattr(CallRecorder, "record", fail_first_settlement)
    resp = chat(env, env.trial_token())
    assert_gateway_error(resp)
    [call] = env.calls()
    assert call.call_id == failed[0] and call.status == 500 and call.usage_estimated
    assert call.tokens.total == call.reserved
    assert outstanding(env) == 0
    assert_replay_verifies(env)


def test_a_fault_after_an_event_is_handed_on_neither_doubles_it_nor_the_room(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget refusal of an admitted call frees its room by waking waiters; a fault
    # there comes after the event was handed to the writer.
    def broken_wake(self: EventRoom) -> None:
        raise Boom("injected")

    env = open_env(sqlite_url, make_terms(target_tokens=100))
    try:
        monkeypatch.setattr(EventRoom, "wake", broken_wake)
        resp = chat(env, env.trial_token(), max_tokens=500)
        assert resp.status_code == 402, resp.text
        [call] = env.calls()
        assert call.code == "budget_exhausted"
        assert env.gateway.room._forwarding == 0 and env.gateway.room.owed == 0
        assert env.gateway.trial_usage(env.run_id, "t1").calls == 1
        assert_replay_verifies(env)
    finally:
        close_env(env)


async def cancelling_upstream(scope: Any, receive: Any, send: Any) -> None:
    """An upstream whose call is cancelled (as a server's shutdown cancels its tasks)."""
    if scope["type"] == "http":
        raise asyncio.CancelledError("cancelled (test)")


def test_a_cancelled_call_is_recorded_and_its_reservation_settled(sqlite_url: str) -> None:
    env = open_env(sqlite_url, make_terms(), upstream_app=cancelling_upstream)
    try:
        resp = chat(env, env.trial_token())
        assert resp.status_code == 500
        [call] = env.calls()
        assert call.allowed and call.usage_estimated and call.tokens.total == call.reserved
        assert call.reason == "gateway error: the call was cancelled"
        assert outstanding(env) == 0 and env.gateway.room.owed == 0
        assert_replay_verifies(env)
    finally:
        close_env(env)
