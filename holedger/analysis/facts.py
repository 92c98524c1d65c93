"""What the cross-run analyses read of one run, in one pass over its signed records: the
gain (:func:`holedger.analysis.gains.gain_of`), the optimizer descriptor, the best val
aggregate disclosed (A16), budget use per split and which component bound first (A14),
target-model tokens by phase (A15) and optimizer tokens (A17), and the candidates
committed (A12). Nothing is re-executed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from holedger.analysis.gains import RunGain, gain_of
from holedger.analysis.stats import round_means_se
from holedger.ledger.records import Record
from holedger.protocol.rules import add_use, no_use
from holedger.schemas.events import (
    CandidateCommitted,
    DisclosureProjected,
    EvaluationRequested,
    GatewayCall,
    OptimizerDescriptor,
    OptimizerRead,
    RescoreOf,
    RunClosed,
    RunOpened,
    RunScored,
)


@dataclass(frozen=True)
class Candidate:
    commit: str
    parent: str | None
    changed_paths: tuple[str, ...]
    tree: str = ""


@dataclass(frozen=True)
class RunFacts(RunGain):
    descriptor: OptimizerDescriptor | None = None
    val_best: Fraction | None = None
    val_aggregates: int = 0
    calls: dict[str, int] = field(default_factory=dict)  # per search split, used
    call_limits: dict[str, int] = field(default_factory=dict)
    passes: dict[str, Fraction] = field(default_factory=dict)
    pass_limits: dict[str, Fraction] = field(default_factory=dict)
    first_bound: str | None = None  # the budget component exhausted first, if any
    target_tokens_search: int = 0
    target_tokens_heldout: int = 0
    target_token_cap: int = 0
    optimizer_tokens: dict[str, int] = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()
    round_means: tuple[Fraction, ...] = ()  # E(H+)'s K round means on test
    se_h_plus: float | None = None  # their standard error (A3)
    reads: Reads | None = None  # the optimizer's recorded reads; None: none recorded
    nominee: str | None = None  # the nominated candidate's commit
    rescore_of: RescoreOf | None = None  # a re-scoring run's binding (holedger rescore)
    k: int = 0  # attempts per test case of its held-out scoring

    @property
    def nominee_tree(self) -> str | None:
        return next((c.tree for c in self.candidates if c.commit == self.nominee), None)


@dataclass(frozen=True)
class Reads:
    """What the optimizer's OptimizerRead events say it looked at (A12, A13)."""

    by_kind: dict[str, int]  # run, budget, tree, file, blob
    output_reads: int  # evaluation output read: blobs (a trial's answer or trace), projections
    trace_reads: int  # of those, traces: the most detailed fetch (A13's deep fetch)
    actions: int  # every optimizer action: reads, commits, evaluation requests, nomination
    examined: tuple[tuple[str, str | None], ...]  # (candidate, path; None: its whole tree)


def facts_of(run_id: str, records: Iterable[Record]) -> RunFacts | str:
    """The run's facts, or why it has none: a one-line reason (never scored, aborted,
    cut before its end, an audit's control run)."""
    records = list(records)
    gain = gain_of(run_id, records)
    opened: RunOpened | None = None
    closed: RunClosed | None = None
    used = no_use()
    split_of: dict[str, str] = {}
    val_best: Fraction | None = None
    aggregates = 0
    first_bound: str | None = None
    target_search = target_heldout = 0
    opt = {"input": 0, "cached": 0, "output": 0, "reasoning": 0, "total": 0}
    candidates: list[Candidate] = []
    rounds: list[Fraction] = []
    se: float | None = None
    kinds: dict[str, int] = {}
    blob_roles = {"answer": 0, "trace": 0}
    examined: dict[tuple[str, str | None], None] = {}
    own_actions = 0  # commits, evaluation requests and the nomination
    nominee: str | None = None
    held_k = 0
    for rec in records:
        if rec.type == "CandidateNominated":
            own_actions += 1
            nominee = nominee or str(rec.payload.get("candidate"))
        if rec.type not in _READ:
            continue
        payload = rec.typed_payload()
        if isinstance(payload, RunOpened):
            opened = payload
        elif isinstance(payload, OptimizerRead):
            for item in payload.reads:
                kinds[item.kind] = kinds.get(item.kind, 0) + 1
                if item.role is not None:
                    blob_roles[item.role] += 1
                if item.candidate and (item.kind == "file" or item.contents):
                    examined.setdefault((item.candidate, item.path), None)
        elif isinstance(payload, EvaluationRequested):
            split_of[payload.request_id] = payload.split
            if payload.split != "test" or payload.decision == "rejected":
                own_actions += 1  # not the server's held-out scoring
            if payload.decision == "accepted" and payload.split in ("dev", "val"):
                used = add_use(used, payload.split, payload.cost)
                if first_bound is None and opened is not None:
                    first_bound = _exhausted(opened, used)
        elif isinstance(payload, DisclosureProjected):
            if payload.split == "val" and payload.policy == "aggregate":
                mean = payload.projection.get("mean")
                if isinstance(mean, str):
                    value = Fraction(mean)
                    aggregates += 1
                    val_best = value if val_best is None else max(val_best, value)
        elif isinstance(payload, GatewayCall):
            if payload.scope == "optimizer":
                for k in opt:
                    opt[k] += getattr(payload.tokens, k)
            elif split_of.get(payload.request_id or "") == "test":
                target_heldout += payload.tokens.total
            else:
                target_search += payload.tokens.total
                cap = opened.terms.budget.target_tokens if opened else 0
                if first_bound is None and cap and target_search >= cap:
                    first_bound = "target_tokens"
        elif isinstance(payload, CandidateCommitted):
            own_actions += payload.index > 0  # the seed is the server's, not an action
            candidates.append(
                Candidate(
                    payload.candidate, payload.parent, tuple(payload.changed_paths), payload.tree
                )
            )
        elif isinstance(payload, RunClosed):
            closed = payload
        elif isinstance(payload, RunScored):
            rounds, se = round_means_se([c.scores for c in payload.per_case])
            held_k = payload.k
    if opened is not None and opened.control_of is not None:
        of = opened.control_of
        return f"a control run of audit {of.audit_id} of run {of.run_id}, no optimizer's search"
    if closed is not None and "abort" in closed.reason:
        return f"aborted ({closed.reason})"
    if gain is None or opened is None:
        if opened is None:
            return "no RunOpened"
        if closed is None:
            return "not closed (still open, or its log is cut)"
        return f"closed ({closed.reason}) without a held-out score"
    budget = opened.terms.budget
    return RunFacts(
        **gain.__dict__,
        descriptor=opened.descriptor,
        val_best=val_best,
        val_aggregates=aggregates,
        calls={"dev": used.dev.calls, "val": used.val.calls},
        call_limits={"dev": budget.dev.calls, "val": budget.val.calls},
        passes={"dev": used.dev.case_passes, "val": used.val.case_passes},
        pass_limits={"dev": budget.dev.case_passes, "val": budget.val.case_passes},
        first_bound=first_bound,
        target_tokens_search=target_search,
        target_tokens_heldout=target_heldout,
        target_token_cap=budget.target_tokens,
        optimizer_tokens=opt,
        candidates=tuple(candidates),
        round_means=tuple(rounds),
        se_h_plus=se,
        nominee=nominee,
        rescore_of=opened.rescore_of,
        k=held_k,
        reads=None
        if not kinds
        else Reads(
            by_kind=kinds,
            output_reads=blob_roles["answer"] + blob_roles["trace"] + kinds.get("projection", 0),
            trace_reads=blob_roles["trace"],
            actions=own_actions + sum(kinds.values()),
            examined=tuple(examined),
        ),
    )


_READ = frozenset(
    {
        "RunOpened",
        "EvaluationRequested",
        "DisclosureProjected",
        "GatewayCall",
        "CandidateCommitted",
        "RunClosed",
        "RunScored",
        "OptimizerRead",
        "CandidateNominated",
    }
)
# Every type facts_of (and gain_of) reads; a reader may skip the others unparsed.
FACT_TYPES = _READ


def _exhausted(opened: RunOpened, used: object) -> str | None:
    budget = opened.terms.budget
    for split in ("dev", "val"):
        limit = getattr(budget, split)
        use = getattr(used, split)
        if limit.calls and use.calls >= limit.calls:
            return f"{split}_calls"
        if limit.case_passes and use.case_passes >= limit.case_passes:
            return f"{split}_case_passes"
    return None
