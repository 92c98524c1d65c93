"""Property: under any interleaving of reservations and settlements the cap holds, replay
re-derives every decision exactly, and any edit of a recorded decision is caught."""

from __future__ import annotations

import random
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from holedger.gateway.budget import RunBudget, add_usage
from holedger.ledger.keys import SigningKey
from holedger.ledger.records import payload_dict, sign_event
from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.context import ReplayContext
from holedger.replay.inputs import CheckInputs
from holedger.replay.report import ReplayReport, ReportBuilder
from holedger.schemas.events import (
    GatewayBudgetState,
    GatewayCall,
    PublicKeyInfo,
    RunOpened,
    TokenUsage,
    TrialCompleted,
)
from holedger.schemas.types import ZERO_HASH

from .helpers import completed_trial, digest, make_terms

KEY = SigningKey.generate("property-test")


def call_event(
    call_id: str,
    trial: str,
    reserved: int,
    state: GatewayBudgetState,
    *,
    index: int | None,
    total: int = 0,
    estimated: bool = False,
) -> GatewayCall:
    tokens = TokenUsage(input=total // 2, output=total - total // 2, total=total)
    return GatewayCall(
        call_id=call_id,
        scope="target",
        trial_id=trial,
        model_requested="holedger-sim-1",
        model_served="holedger-sim-1" if index is not None else None,
        allowed=index is not None,
        code=None if index is not None else "budget_exhausted",
        status=200 if index is not None else 402,
        tokens=tokens,
        reserved=reserved,
        usage_estimated=estimated,
        latency_ms=0,
        request_digest=None,
        response_digest=None,
        reservation_index=index,
        budget=state,
    )


def simulate(seed: int, cap: int, trial_cap: int | None, steps: int) -> list[GatewayCall]:
    """The gateway's budget protocol under a random schedule of calls starting and ending."""
    rng = random.Random(seed)
    budget = RunBudget(cap=cap, trial_cap=trial_cap)
    events: list[GatewayCall] = []
    pending: dict[str, tuple[str, int, GatewayBudgetState, int]] = {}
    for _ in range(steps):
        if pending and rng.random() < 0.5:
            call_id = rng.choice(sorted(pending))
            trial, amount, state, index = pending.pop(call_id)
            estimated = rng.random() < 0.1
            total = amount if estimated else rng.randint(0, amount)
            event = call_event(
                call_id, trial, amount, state, index=index, total=total, estimated=estimated
            )
            budget.settle(call_id, total, lambda e=event: events.append(e))  # type: ignore[misc]
            continue
        call_id, trial, amount = uuid.uuid4().hex, f"t{rng.randint(0, 3)}", rng.randint(1, 300)

        def denied(
            state: GatewayBudgetState, which: str, c: str = call_id, t: str = trial, a: int = amount
        ) -> None:
            events.append(call_event(c, t, a, state, index=None))

        state, index = budget.reserve(call_id, trial, amount, denied)
        if index is not None:
            pending[call_id] = (trial, amount, state, index)
    for call_id, (trial, amount, state, index) in sorted(pending.items()):
        event = call_event(call_id, trial, amount, state, index=index, total=amount // 2)
        budget.settle(call_id, amount // 2, lambda e=event: events.append(e))  # type: ignore[misc]
    return events


def trial_totals(events: list[GatewayCall]) -> list[TrialCompleted]:
    """What the server writes when each trial ends: the sums of its calls."""
    sums: dict[str, TokenUsage] = {}
    counts: dict[str, int] = {}
    for e in events:
        assert e.trial_id is not None
        sums[e.trial_id] = add_usage(sums.get(e.trial_id, TokenUsage()), e.tokens)
        counts[e.trial_id] = counts.get(e.trial_id, 0) + 1
    return [completed_trial(trial, sums[trial], counts[trial]) for trial in sorted(sums)]


def replay(
    events: list[GatewayCall],
    cap: int,
    trial_cap: int | None,
    trials: list[TrialCompleted] | None = None,
) -> ReplayReport:
    terms = make_terms(target_tokens=cap, per_trial=trial_cap)
    key = PublicKeyInfo(name=KEY.name, key_id=KEY.key_id_hex, public_key=KEY.public.b64)
    opened = RunOpened(
        task_id=terms.task_id,
        task_digest=digest("task"),
        terms=terms,
        keys={"server": key, "gateway": key},
        origin="holedger/run/property",
        checkpoint_interval=64,
    )
    run_id = str(uuid.uuid4())
    projection = GatewayFold(ReplayContext(run_id, opened, None, CheckInputs()))  # type: ignore[arg-type]
    payloads: list[GatewayCall | TrialCompleted] = [*events, *(trials or trial_totals(events))]
    for seq, payload in enumerate(payloads, start=1):
        kind = type(payload).__name__
        rec = sign_event(
            KEY,
            run_id=run_id,
            seq=seq,
            event_type=kind,
            role="gateway" if kind == "GatewayCall" else "server",
            prev_hash=ZERO_HASH,
            payload=payload_dict(kind, payload),
        )
        projection.apply(rec, payload)
    out = ReportBuilder()
    projection.finish(out)
    return out.build(run_id, len(events))


schedules = st.tuples(
    st.integers(0, 2**32),
    st.integers(0, 2000),
    st.one_of(st.none(), st.integers(0, 800)),
    st.integers(1, 120),
)


@settings(max_examples=60, deadline=None)
@given(schedules)
def test_any_schedule_holds_the_cap_and_replays_clean(schedule: tuple[int, int, Any, int]) -> None:
    seed, cap, trial_cap, steps = schedule
    events = simulate(seed, cap, trial_cap, steps)
    settled = sum(e.tokens.total for e in events if e.reservation_index is not None)
    assert settled <= cap
    report = replay(events, cap, trial_cap)
    assert report.verified, [f.reason for f in report.failures]
    assert report.sections["gateway"]["overshoot"] == 0


EDITS = ("settled", "outstanding", "flip_denied", "drop_settlement", "swap_indices")


@settings(max_examples=150, deadline=None)
@given(schedules, st.sampled_from(EDITS), st.integers(0, 10**6))
def test_any_edit_of_a_decision_is_caught(
    schedule: tuple[int, int, Any, int], edit: str, pick: int
) -> None:
    seed, cap, trial_cap, steps = schedule
    events = simulate(seed, cap, trial_cap, steps)
    honest_trials = trial_totals(events)  # written by the server before any edit
    allowed = [i for i, e in enumerate(events) if e.reservation_index is not None]
    denied = [i for i, e in enumerate(events) if e.reservation_index is None]
    if edit == "settled" and allowed:
        i = allowed[pick % len(allowed)]
        state = events[i].budget
        assert state is not None
        new = state.model_copy(update={"settled": state.settled + 1})
        events[i] = events[i].model_copy(update={"budget": new})
    elif edit == "outstanding" and allowed:
        i = allowed[pick % len(allowed)]
        state = events[i].budget
        assert state is not None
        new = state.model_copy(update={"outstanding": max(0, state.outstanding - 1)})
        if new == state:
            new = state.model_copy(update={"outstanding": 1})
        events[i] = events[i].model_copy(update={"budget": new})
    elif edit == "flip_denied" and denied:
        i = denied[pick % len(denied)]
        events[i] = events[i].model_copy(update={"allowed": True, "code": None, "status": 200})
    elif edit == "drop_settlement" and allowed:
        del events[allowed[pick % len(allowed)]]
    elif edit == "swap_indices" and len(allowed) >= 2:
        i, j = allowed[pick % len(allowed)], allowed[(pick + 1) % len(allowed)]
        a, b = events[i].reservation_index, events[j].reservation_index
        events[i] = events[i].model_copy(update={"reservation_index": b})
        events[j] = events[j].model_copy(update={"reservation_index": a})
    else:
        return  # nothing of that kind in this schedule
    report = replay(events, cap, trial_cap, honest_trials)
    assert not report.verified, edit
