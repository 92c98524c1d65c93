"""How a call becomes its signed events, and each trial's tally of them.

:class:`CallRecorder` hands a call's outcome to the event writer (a snapshot taken in
decision order; the GatewayCall is built, digested and signed on the writer thread) and
keeps each trial's calls so far, which ``close_trial`` returns as the trial's totals.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial

from holedger.gateway.budget import add_usage
from holedger.gateway.call import ZERO, Call, TrialUsage
from holedger.gateway.fallback import refused_events as refused
from holedger.gateway.recorder import EventRoom, Events, EventWriter, Submission
from holedger.schemas.canonical import canonical_json, has_utf8_form
from holedger.schemas.events import GatewayCall, SafetyViolation, TokenUsage
from holedger.untrusted import escape_text

log = logging.getLogger("holedger.gateway")


@dataclass
class Tally:
    calls: int = 0
    tokens: TokenUsage = ZERO
    in_flight: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    def count(self, tokens: TokenUsage, status: int, code: str | None, reason: str | None) -> None:
        self.calls += 1
        self.tokens = add_usage(self.tokens, tokens)
        if status >= 400:
            # A denial has a code; an upstream's error has a reason, and its status tells
            # one (a 401, a 429) from another.
            key = code or (f"{reason[:80]}, status {status}" if reason else f"status {status}")
            self.failed[key] = self.failed.get(key, 0) + 1


class CallRecorder:
    """Records calls (one GatewayCall each) and counts each trial's calls and tokens."""

    def __init__(self, writer: EventWriter, room: EventRoom, blob_cap: int) -> None:
        self.writer = writer
        self.room = room
        self.blob_cap = blob_cap
        self._tallies: dict[tuple[str, str], Tally] = {}
        self._cond = threading.Condition()

    def trial_usage(self, run_id: str, trial_id: str) -> TrialUsage:
        with self._cond:
            tally = self._tallies.get((run_id, trial_id), Tally())
            return TrialUsage(tally.tokens, tally.calls, tally.in_flight == 0, dict(tally.failed))

    def wait_trial_idle(self, run_id: str, trial_id: str, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(
                lambda: self._tallies.get((run_id, trial_id), Tally()).in_flight == 0,
                timeout=timeout,
            )

    def restore(self, run_id: str, recorded: GatewayCall) -> None:
        """Count a GatewayCall already in the ledger (a run loaded after a restart)."""
        if recorded.trial_id is None:
            return
        with self._cond:
            tally = self._tallies.setdefault((run_id, recorded.trial_id), Tally())
            tally.count(recorded.tokens, recorded.status, recorded.code, recorded.reason)

    def track(self, call: Call, delta: int) -> None:
        """Count ``call`` in (+1) or out of (-1) its trial's calls in flight."""
        if call.run_id is None or call.trial_id is None:
            return
        with self._cond:
            tally = self._tallies.setdefault((call.run_id, call.trial_id), Tally())
            tally.in_flight += delta
            if tally.in_flight == 0:
                self._cond.notify_all()

    def record(
        self,
        call: Call,
        *,
        allowed: bool,
        status: int,
        code: str | None = None,
        reason: str | None = None,
        tokens: TokenUsage = ZERO,
        response: bytes = b"",
        usage_estimated: bool = False,
        model_reported: str | None = None,
        safety: str | None = None,
        extra_runs: list[str] | None = None,
    ) -> None:
        """Hand ``call``'s GatewayCall (and SafetyViolation) to the writer; nothing for a
        call no run vouches for."""
        if call.run_id is None:
            return
        # Only what the blobs keep (the first blob_cap bytes) stays in memory until written.
        cap = self.blob_cap
        snapshot = copy.copy(call)
        snapshot.request_bytes = call.request_bytes[:cap]
        outcome = Outcome(
            call=snapshot,
            allowed=allowed,
            status=status,
            code=code,
            reason=reason,
            tokens=tokens,
            response=response[:cap],
            usage_estimated=usage_estimated,
            model_reported=model_reported,
            safety=safety,
            latency_ms=int((time.perf_counter() - call.t0) * 1000),
        )
        item = Submission(call.run_id, build=outcome.events, fallback=partial(refused, snapshot))
        # Handing the event to the writer is the commit point: the flags say so first, so
        # a fault after it can never record the call twice or give its room back twice.
        admitted, call.admitted, call.recorded = call.admitted, False, True
        self.room.submit(item, admitted=admitted, forwarded=allowed)
        try:  # past the commit point nothing may raise: the caller settles as recorded
            for other in extra_runs or []:
                self.writer.submit(Submission(other, build=outcome.violation))
            if call.trial_id is not None:
                with self._cond:
                    tally = self._tallies.setdefault((call.run_id, call.trial_id), Tally())
                    tally.count(tokens, status, code, reason)
        except Exception:
            log.exception("gateway error after recording call %s", call.call_id)


@dataclass(frozen=True)
class Outcome:
    """How one call ended; becomes its GatewayCall (and SafetyViolation) on the writer."""

    call: Call
    allowed: bool
    status: int
    code: str | None
    reason: str | None
    tokens: TokenUsage
    response: bytes
    usage_estimated: bool
    model_reported: str | None
    safety: str | None
    latency_ms: int

    def events(self) -> tuple[Events, list[bytes]]:
        # The bodies were cut to blob_cap_bytes when the snapshot was taken (record).
        call = self.call
        blobs: list[bytes] = []
        req_digest = resp_digest = None
        if call.request_bytes:
            blobs.append(call.request_bytes)
            req_digest = hashlib.sha256(call.request_bytes).hexdigest()
        if self.response:
            blobs.append(self.response)
            resp_digest = hashlib.sha256(self.response).hexdigest()
        event = GatewayCall(
            call_id=call.call_id,
            scope=call.scope,
            request_id=call.request_id,
            trial_id=call.trial_id,
            case_id=call.case_id,
            attempt=call.attempt,
            model_requested=_text(call.model_requested),
            model_served=_text(call.model_served) if self.allowed else None,
            allowed=self.allowed,
            reason=_text(self.reason),
            status=self.status,
            stream=call.stream,
            tokens=self.tokens,
            reserved=call.reserved,
            max_tokens_imposed=call.max_tokens_imposed,
            usage_estimated=self.usage_estimated,
            latency_ms=self.latency_ms,
            request_digest=req_digest,
            response_digest=resp_digest,
            endpoint=_text(call.endpoint),
            code=self.code,
            model_reported=_text(self.model_reported),
            reservation_index=call.reservation_index,
            budget=call.budget,
            presented=call.presented,
            format=call.fmt.name if call.endpoint == call.fmt.path else None,
        )
        events: Events = [("GatewayCall", event, "gateway")]
        if self.safety is not None:
            violation, more = self.violation()
            events += violation
            blobs += more
        return events, blobs

    def violation(self) -> tuple[Events, list[bytes]]:
        """The SafetyViolation and its evidence blob (also recorded on other runs)."""
        call = self.call
        assert self.safety is not None
        evidence = canonical_json(
            {
                "call_id": call.call_id,
                "code": self.code,
                "model_requested": _text(call.model_requested),
                "presented": call.presented.model_dump(mode="json") if call.presented else None,
                "run_id": call.run_id,
                "trial_id": call.trial_id,
            }
        )
        violation = SafetyViolation(
            category=self.safety,
            trial_id=call.trial_id,
            call_id=call.call_id,
            detail=escape_text(_text(self.reason) or self.safety),
            evidence_digest=hashlib.sha256(evidence).hexdigest(),
        )
        return [("SafetyViolation", violation, "gateway")], [evidence]


def _text(value: str | None) -> str | None:
    """``value`` as event text: a lone surrogate (from an upstream's answer or an error
    message) is written as its backslash escape, so the event can still be signed."""
    if value is None or has_utf8_form(value):
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
