"""The typed timeline of a run, the one thing the HTML report renders from.

It is built once, while the run is replayed: a fold given to the engine beside the
registered checks sees every verified event as its typed payload, in seq order, and only
those (events from a break in the log on are not folded in; the verdict at the top of the
page says where). Beside the run's events it holds the seed-baseline run's held-out
scores, taken from that run's own replay, what replay concluded
(:class:`~holedger.replay.html.verdict.Verification`), and, when given, each candidate's
diff and the prepared edit it is, and the run's audits as the audit room read them. Every
value is frozen: a section reads it, never folds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from holedger.ledger.records import Record
from holedger.replay.context import Fold
from holedger.replay.html.audits import AuditSummary
from holedger.replay.html.diffs import CandidateDiff
from holedger.replay.html.stats import held_out_standard_error, standard_error
from holedger.replay.html.verdict import Verification
from holedger.replay.inputs import CheckContext, CheckFactory
from holedger.replay.report import ReportBuilder
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    CaseScores,
    DisclosureProjected,
    EvaluationRequested,
    EvolveTerms,
    GatewayCall,
    InSituScored,
    Model,
    RunClosed,
    RunOpened,
    RunScored,
    SafetyViolation,
    SeedBaseline,
    StepClosed,
    TaskTerms,
    TrialCompleted,
)

PerCase = Mapping[str, tuple[Fraction, ...]]
"""Scores by case id, in attempt order."""


@dataclass(frozen=True)
class Header:
    """The run as RunOpened and RunClosed say it."""

    run_id: str
    task_id: str = "?"
    task_digest: str = "?"
    optimizer: str = "?"
    opened_at: str = "?"
    terms: TaskTerms | None = None
    seed_baseline: SeedBaseline | None = None
    solve_evolve: EvolveTerms | None = None
    closed_at: str | None = None
    close_reason: str | None = None


@dataclass(frozen=True)
class Candidate:
    """A committed candidate; ``diff`` against its parent when the run's repository was
    read (with the prepared edit, and so the lever, it is)."""

    seq: int
    index: int
    commit: str
    parent: str | None
    changed: tuple[str, ...]
    immutable_ok: bool = True
    diff: CandidateDiff | None = None

    @property
    def lever(self) -> str | None:
        """The lever of the task's prepared edit this candidate is, if it is one."""
        edit = self.diff.edit if self.diff else None
        return edit.lever or None if edit else None


@dataclass(frozen=True)
class Trial:
    seq: int
    trial_id: str
    request_id: str
    candidate: str
    split: str
    case_id: str
    attempt: int
    score: Fraction
    tokens: int
    wall_ms: int = 0
    backend: str = "?"
    isolation: str = "?"


@dataclass(frozen=True)
class Evaluation:
    """One evaluation request and the trials recorded for it, in seq order."""

    seq: int
    request_id: str
    candidate: str
    split: str
    cases: int
    attempts: int
    decision: str
    reason: str | None = None
    trials: tuple[Trial, ...] = ()

    @property
    def scores(self) -> list[Fraction]:
        return [t.score for t in self.trials]

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.trials)

    @property
    def by_case(self) -> dict[str, list[Fraction]]:
        """Each case's scores, cases in the order their first trial was recorded."""
        out: dict[str, list[Fraction]] = {}
        for trial in self.trials:
            out.setdefault(trial.case_id, []).append(trial.score)
        return out

    @property
    def case_means(self) -> list[Fraction]:
        return [sum(s, Fraction(0)) / len(s) for s in self.by_case.values()]

    @property
    def mean(self) -> Fraction | None:
        """The mean over cases of each case's mean (the disclosed mean's definition)."""
        means = self.case_means
        return sum(means, Fraction(0)) / len(means) if means else None

    @property
    def standard_error(self) -> float | None:
        """The standard error of the per-case means (None with fewer than two cases)."""
        return standard_error(self.case_means)


@dataclass(frozen=True)
class Usage:
    """The gateway calls of one scope (``target``: the trials; ``optimizer``)."""

    scope: str
    calls: int = 0
    denied: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class Disclosure:
    """A projection shown to the optimizer."""

    seq: int
    request_id: str
    split: str
    policy: str
    digest: str


@dataclass(frozen=True)
class Violation:
    seq: int
    category: str
    detail: str
    trial_id: str | None = None
    call_id: str | None = None


@dataclass(frozen=True)
class HeldOut:
    """Held-out scores (the nominee's, from RunScored, or the seed baseline's, from its
    run's RunScored), with the standard error of their K round means."""

    run_id: str
    candidate: str
    k: int
    per_case: PerCase
    e_h_plus: Fraction
    e_h0: Fraction | None = None
    g: Fraction | None = None

    @property
    def standard_error(self) -> float | None:
        return held_out_standard_error(self.per_case)


@dataclass(frozen=True)
class Step:
    """A closed solve-evolve step."""

    seq: int
    step: int
    outcome: str
    parent: str
    candidate: str
    request_id: str
    evolver_tokens: int


@dataclass(frozen=True)
class InSitu:
    """A solve-evolve run's in-situ score J over its stream, and Base and J - Base."""

    seq: int
    per_case: PerCase
    j: Fraction
    base: Fraction | None
    delta: Fraction | None


@dataclass(frozen=True)
class Timeline:
    """Everything the report shows of one run, typed."""

    header: Header
    verification: Verification
    candidates: tuple[Candidate, ...] = ()
    evaluations: tuple[Evaluation, ...] = ()
    usage: tuple[Usage, ...] = ()
    disclosures: tuple[Disclosure, ...] = ()
    violations: tuple[Violation, ...] = ()
    nominated: str | None = None
    held_out: HeldOut | None = None
    baseline: HeldOut | None = None
    steps: tuple[Step, ...] = ()
    in_situ: InSitu | None = None
    audits: tuple[AuditSummary, ...] = ()

    @property
    def run_id(self) -> str:
        return self.header.run_id

    @property
    def trials(self) -> list[Trial]:
        """Every trial, in seq order."""
        return sorted((t for e in self.evaluations for t in e.trials), key=lambda t: t.seq)

    @property
    def gateway_calls(self) -> int:
        return sum(u.calls for u in self.usage)

    @property
    def gateway_denied(self) -> int:
        return sum(u.denied for u in self.usage)

    def candidate_index(self, commit: str) -> str:
        """``#index`` of a committed candidate, else the commit's first 8 digits."""
        for cand in self.candidates:
            if cand.commit == commit:
                return f"#{cand.index}"
        return commit[:8]

    def with_diffs(self, diffs: Mapping[str, CandidateDiff]) -> Timeline:
        """The timeline with each candidate's diff (by commit) where one was read."""
        cands = tuple(replace(c, diff=diffs.get(c.commit, c.diff)) for c in self.candidates)
        return replace(self, candidates=cands)

    def with_audits(self, audits: Sequence[AuditSummary]) -> Timeline:
        """The timeline with the run's audits, as the audit room read them."""
        return replace(self, audits=tuple(audits))


def per_case(entries: Sequence[CaseScores]) -> dict[str, tuple[Fraction, ...]]:
    """Recorded per-case scores as exact fractions, by case id."""
    return {e.case_id: tuple(Fraction(s) for s in e.scores) for e in entries}


def held_out(run_id: str, scored: RunScored) -> HeldOut:
    return HeldOut(
        run_id,
        scored.candidate,
        scored.k,
        per_case(scored.per_case),
        Fraction(scored.e_h_plus),
        None if scored.e_h0 is None else Fraction(scored.e_h0),
        None if scored.g is None else Fraction(scored.g),
    )


@dataclass
class _Request:
    head: EvaluationRequested
    seq: int
    trials: list[Trial] = field(default_factory=list)


class TimelineFold:
    """Folds a run's verified events into what :class:`Timeline` holds; reports nothing."""

    name = "timeline"

    def __init__(self, ctx: CheckContext) -> None:
        opened: RunOpened = ctx.opened
        self.header = Header(
            ctx.run_id,
            opened.task_id,
            opened.task_digest,
            opened.optimizer,
            terms=opened.terms,
            seed_baseline=opened.seed_baseline,
            solve_evolve=opened.solve_evolve,
        )
        self.candidates: list[Candidate] = []
        self.requests: dict[str, _Request] = {}
        self.usage: dict[str, Usage] = {}
        self.disclosures: list[Disclosure] = []
        self.violations: list[Violation] = []
        self.nominated: str | None = None
        self.scored: RunScored | None = None
        self.steps: list[Step] = []
        self.in_situ: InSitu | None = None

    def apply(self, rec: Record, payload: Model) -> None:
        seq = rec.seq
        if isinstance(payload, RunOpened):
            self.header = replace(self.header, opened_at=str(rec.time))
        elif isinstance(payload, CandidateCommitted):
            self.candidates.append(
                Candidate(
                    seq,
                    payload.index,
                    payload.candidate,
                    payload.parent,
                    tuple(payload.changed_paths),
                    payload.immutable_ok,
                )
            )
        elif isinstance(payload, EvaluationRequested):
            self.requests[payload.request_id] = _Request(payload, seq)
        elif isinstance(payload, TrialCompleted):
            self._trial(seq, payload)
        elif isinstance(payload, GatewayCall):
            was = self.usage.get(payload.scope, Usage(payload.scope))
            self.usage[payload.scope] = Usage(
                payload.scope,
                was.calls + 1,
                was.denied + (not payload.allowed),
                was.tokens + payload.tokens.total,
            )
        elif isinstance(payload, DisclosureProjected):
            self.disclosures.append(
                Disclosure(
                    seq,
                    payload.request_id,
                    payload.split,
                    payload.policy,
                    payload.projection_digest,
                )
            )
        elif isinstance(payload, SafetyViolation):
            self.violations.append(
                Violation(seq, payload.category, payload.detail, payload.trial_id, payload.call_id)
            )
        elif isinstance(payload, CandidateNominated) and self.nominated is None:
            self.nominated = payload.candidate
        elif isinstance(payload, RunScored):
            self.scored = payload
        elif isinstance(payload, StepClosed):
            self.steps.append(
                Step(
                    seq,
                    payload.step,
                    payload.outcome,
                    payload.parent,
                    payload.candidate,
                    payload.request_id,
                    payload.evolver_tokens,
                )
            )
        elif isinstance(payload, InSituScored):
            self.in_situ = InSitu(
                seq,
                per_case(payload.per_case),
                Fraction(payload.j),
                None if payload.base is None else Fraction(payload.base),
                None if payload.delta is None else Fraction(payload.delta),
            )
        elif isinstance(payload, RunClosed):
            self.header = replace(self.header, closed_at=str(rec.time), close_reason=payload.reason)

    def _trial(self, seq: int, p: TrialCompleted) -> None:
        request = self.requests.get(p.request_id)
        if request is None:  # a trial of no request: the order check fails the log
            return
        request.trials.append(
            Trial(
                seq,
                p.trial_id,
                p.request_id,
                p.candidate,
                p.split,
                p.case_id,
                p.attempt,
                Fraction(p.score),
                p.tokens.total,
                p.wall_ms,
                p.backend,
                p.isolation,
            )
        )

    def finish(self, out: ReportBuilder) -> None:
        """The timeline is what this fold gives; the report gets nothing from it."""

    def evaluations(self) -> tuple[Evaluation, ...]:
        return tuple(
            Evaluation(
                r.seq,
                r.head.request_id,
                r.head.candidate,
                r.head.split,
                len(r.head.case_ids),
                r.head.attempts,
                r.head.decision,
                r.head.reason,
                tuple(r.trials),
            )
            for r in self.requests.values()
        )


class Collected:
    """What a :class:`TimelineFold` folded, once the replay is over (None: the run's
    RunOpened never verified, so no fold was built)."""

    fold: TimelineFold | None = None


def collecting(checks: Sequence[CheckFactory]) -> tuple[list[CheckFactory], Collected]:
    """``checks`` plus the timeline's fold, which leaves what it folded in the returned
    :class:`Collected`."""
    collected = Collected()

    def make(ctx: CheckContext) -> Fold:
        collected.fold = TimelineFold(ctx)
        return collected.fold

    return [*checks, make], collected


def build_timeline(
    run_id: str,
    collected: Collected,
    verification: Verification,
    baseline: Callable[[str], RunScored | None] | None = None,
) -> Timeline:
    """The timeline of a replayed run from what its fold collected; ``baseline`` gives the
    RunScored of the seed-baseline run it pins, when that run was replayed."""
    fold = collected.fold
    if fold is None:
        return Timeline(Header(run_id), verification)
    pinned = fold.header.seed_baseline
    base_id = pinned.baseline_run_id if pinned else None
    base_scored = baseline(base_id) if baseline and base_id and base_id != run_id else None
    return Timeline(
        fold.header,
        verification,
        tuple(fold.candidates),
        fold.evaluations(),
        tuple(fold.usage[s] for s in sorted(fold.usage, key=_scope_order)),
        tuple(fold.disclosures),
        tuple(fold.violations),
        fold.nominated,
        None if fold.scored is None else held_out(run_id, fold.scored),
        None if base_scored is None or base_id is None else held_out(base_id, base_scored),
        tuple(fold.steps),
        fold.in_situ,
    )


def _scope_order(scope: str) -> tuple[int, str]:
    return (("target", "optimizer").index(scope) if scope in ("target", "optimizer") else 2, scope)
