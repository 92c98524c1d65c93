"""A run's state as the writer needs it, folded from the run's own events.

The server decides nothing from memory it did not get from the ledger: before each
decision it folds the events appended since its last look (its cache per run, per
process), decides, and appends with ``expected_seq`` = the head it decided on. A writer
that lost a race gets LedgerConflictError, folds the new events and decides again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from holedger.ledger.records import Record
from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.schemas.events import (
    BudgetUse,
    CandidateCommitted,
    DisclosureProjected,
    EvaluationRequested,
    RunOpened,
    RunScored,
)


@dataclass(frozen=True)
class CandidateInfo:
    commit: str
    index: int
    tree: str
    parent: str | None
    seq: int


@dataclass
class RunState:
    """Everything the writer decides on, re-derived from events in seq order."""

    run_id: str
    opened: RunOpened
    next_seq: int = 0
    candidates: dict[str, CandidateInfo] = field(default_factory=dict)
    used: BudgetUse = field(default_factory=rules.no_use)
    requests: int = 0
    nominated: str | None = None
    scored: RunScored | None = None
    closed: bool = False
    closed_reason: str | None = None  # RunClosed.reason: completed, aborted, ...
    # The held-out request recorded after the nomination (a resumed nomination reuses it).
    heldout: EvaluationRequested | None = None
    # The blobs the optimizer was shown (a trial's answer or trace digest in a projection),
    # each with its role: "answer" or "trace" (rules.fetchable_roles), the first one shown.
    disclosed: dict[str, str] = field(default_factory=dict)
    projections: dict[str, str] = field(default_factory=dict)  # request id -> digest
    projected_at: dict[str, int] = field(default_factory=dict)  # request id -> its seq
    # Accepted dev and val requests not yet projected: in flight, or left by a server that
    # stopped before recording their trials (RunService.recover records those).
    pending: dict[str, EvaluationRequested] = field(default_factory=dict)
    # Tokens of the recorded model calls, by gateway scope (target: the trials' calls;
    # optimizer: the optimizer's own), and their number.
    tokens: dict[str, int] = field(default_factory=dict)
    gateway_calls: dict[str, int] = field(default_factory=dict)

    def apply(self, rec: Record) -> None:
        self.next_seq = rec.seq + 1
        if rec.type == "CandidateCommitted":
            c = CandidateCommitted.model_validate(rec.payload)
            self.candidates[c.candidate] = CandidateInfo(
                c.candidate, c.index, c.tree, c.parent, rec.seq
            )
        elif rec.type == "EvaluationRequested":
            req = EvaluationRequested.model_validate(rec.payload)
            self.requests += 1
            if req.decision == "accepted":
                self.used = rules.add_use(self.used, req.split, req.cost)
                if req.split == "test" and self.nominated is not None:
                    self.heldout = req
                elif req.split != "test":
                    self.pending[req.request_id] = req
        elif rec.type == "DisclosureProjected":
            proj = DisclosureProjected.model_validate(rec.payload)
            self.projections[proj.request_id] = proj.projection_digest
            self.projected_at.setdefault(proj.request_id, rec.seq)
            self.pending.pop(proj.request_id, None)
            for digest, role in rules.fetchable_roles(proj.projection).items():
                self.disclosed.setdefault(digest, role)
        elif rec.type == "CandidateNominated":
            self.nominated = str(rec.payload["candidate"])
        elif rec.type == "RunScored":
            self.scored = RunScored.model_validate(rec.payload)
        elif rec.type == "GatewayCall":
            scope = str(rec.payload.get("scope"))
            total = rec.payload.get("tokens", {}).get("total", 0)
            self.tokens[scope] = self.tokens.get(scope, 0) + (total if type(total) is int else 0)
            self.gateway_calls[scope] = self.gateway_calls.get(scope, 0) + 1
        elif rec.type == "RunClosed":
            self.closed = True
            self.closed_reason = str(rec.payload.get("reason"))

    @property
    def seed_commit(self) -> str:
        return self.opened.terms.seed_commit

    def resolve_candidate(self, ref: str) -> str | None:
        """A committed candidate from "seed", a full id or a unique prefix (>= 4 chars)."""
        ref = ref.strip().lower()
        if ref == "seed":
            return self.seed_commit if self.seed_commit in self.candidates else None
        if ref in self.candidates:
            return ref
        if len(ref) < 4:
            return None
        matches = [c for c in self.candidates if c.startswith(ref)]
        return matches[0] if len(matches) == 1 else None


class StateCache:
    """Per-process cache of folded run states; thread-safe; always caught up on read."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._states: dict[str, RunState] = {}
        self._lock = threading.Lock()

    def current(self, run_id: str) -> RunState:
        """The run's state folded up to the newest stored event."""
        with self._lock:
            state = self._states.get(run_id)
            if state is None:
                state = RunState(run_id, self.ledger.run_terms(run_id))
                self._states[run_id] = state
            for rec in self.ledger.records(run_id, after_seq=state.next_seq - 1):
                state.apply(rec)
            return _snapshot(state)


def _snapshot(state: RunState) -> RunState:
    return RunState(
        run_id=state.run_id,
        opened=state.opened,
        next_seq=state.next_seq,
        candidates=dict(state.candidates),
        used=state.used,
        requests=state.requests,
        nominated=state.nominated,
        scored=state.scored,
        closed=state.closed,
        closed_reason=state.closed_reason,
        heldout=state.heldout,
        disclosed=dict(state.disclosed),
        projections=dict(state.projections),
        projected_at=dict(state.projected_at),
        pending=dict(state.pending),
        tokens=dict(state.tokens),
        gateway_calls=dict(state.gateway_calls),
    )
