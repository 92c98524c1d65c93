"""The solve-evolve protocol's pure rules, shared by the writer (server/evolve.py) and replay.

A solve-evolve run feeds the agent a pinned stream of cases in batches. Step t is:

1. one accepted EvaluationRequested of H_{t-1} (the seed for t = 1) on batch X_t (the
   stream's cases (t-1)·b .. t·b-1, one attempt each), then its TrialCompleted events:
   each score is fixed here, under H_{t-1};
2. one DisclosureProjected of those trials: the evidence D_t the evolver is shown (case
   ids, answers, trace digests, scores: the verifier's score is its whole feedback);
3. the evolver's optimizer-scope model calls (GatewayCall), if any;
4. either one CandidateCommitted (parent H_{t-1}, every changed path inside the editable
   scope) then StepClosed ``committed``, or StepClosed ``unchanged``; H_t is its
   candidate.

After step T, InSituScored (J, the in-situ pass rate, and Base, the pinned NONE run's J)
and RunClosed. :class:`EvolveLog` folds a run's events in this order and returns, for
each event, what is wrong with it (nothing, for an honest run); the server decides its
next event from the same fold (:func:`solve_refusal`, :func:`close_refusal`), and replay
reports the problems by check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final, Literal

from holedger.protocol import refusals, rules
from holedger.protocol.refusals import Refusal
from holedger.schemas.canonical import canonical_json, rational_to_str
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    DisclosureProjected,
    EvaluationRequested,
    EvolveTerms,
    GatewayCall,
    InSituScored,
    Model,
    RunScored,
    StepClosed,
    TrialCompleted,
)

PROTOCOL = "solve-evolve"
SEARCH = "search"
# The optimizer label of a NONE run: the same stream, no evolver, the seed throughout.
NONE_OPTIMIZER = "solve-evolve-none"
STEP_PREFIX = "step-"

# What a problem is about (replay reports each kind under a check of its own).
ORDER: Final = "order"  # the order of every step
PARENT: Final = "parent"  # each step's trials ran H_{t-1}
FIXED: Final = "fixed"  # every score recorded before its projection and before H_t
SCOPE: Final = "scope"  # every commit inside the scope, on H_{t-1}
BUDGET: Final = "budget"  # the evolver's tokens per step
SCORE: Final = "score"  # J and Base recomputed
Kind = Literal["order", "parent", "fixed", "scope", "budget", "score"]


@dataclass(frozen=True)
class Problem:
    kind: Kind
    text: str


# --------------------------------------------------------------------------- opening


def stream_digest(split: str, stream: Sequence[str]) -> str:
    """SHA-256 (hex) of the canonical JSON ``{"cases": [...], "split": ...}``."""
    return hashlib.sha256(canonical_json({"cases": list(stream), "split": split})).hexdigest()


def normal_scope(folder: str) -> str:
    """A scope folder as pinned: relative, ``/``-separated, one trailing ``/``."""
    return folder.strip().strip("/") + "/"


def open_problem(
    stream: Sequence[str],
    batch: int,
    steps: int,
    scope: Sequence[str],
    seed_paths: Iterable[str],
    immutable: Sequence[str],
) -> tuple[str, str] | None:
    """Why these solve-evolve terms cannot open a run (message, hint), or None.

    ``stream`` is the whole stream offered (the run uses its first steps x batch cases);
    ``scope`` the editable folders as given; ``seed_paths`` the seed's file paths.
    """
    repeated = sorted({c for c in stream if list(stream).count(c) > 1})
    if repeated:
        return (
            f"the stream repeats case {repeated[0]!r}",
            "list each case once: a case is scored once, under the harness of its step",
        )
    if batch < 1:
        return f"--batch must be at least 1, got {batch}", "give the cases per step"
    if batch > len(stream):
        return (
            f"--batch {batch} is larger than the stream of {len(stream)} cases",
            "use a smaller batch, or a longer stream",
        )
    if steps < 1:
        return f"--steps must be at least 1, got {steps}", "give the number of batches to run"
    if steps * batch > len(stream):
        return (
            f"{steps} steps of {batch} cases need {steps * batch}, the stream has {len(stream)}",
            f"use at most {len(stream) // batch} steps, or a smaller batch",
        )
    if not scope:
        return "no editable scope", "name at least one folder of the seed with --scope"
    paths = list(seed_paths)
    for folder in scope:
        norm = normal_scope(folder)
        parts = norm.rstrip("/").split("/")
        if norm == "/" or any(p in ("", ".", "..") for p in parts):
            return f"scope {folder!r} is not a folder path", "name a folder such as harness/"
        if not any(p.startswith(norm) for p in paths):
            return (
                f"scope {folder!r} names no folder of the seed",
                "name a folder the seed harness has (see 'holedger tasks show TASK')",
            )
        for path in immutable:
            fixed = path if path.endswith("/") else path + "/"
            if norm.startswith(fixed) or fixed.startswith(norm):
                return (
                    f"scope {folder!r} overlaps the task's immutable path {path!r}",
                    "the scope may only name folders the task lets a harness change",
                )
    return None


def batch_of(terms: EvolveTerms, step: int) -> list[str]:
    """X_t: the case ids of step ``step`` (numbered from 1)."""
    return terms.stream[(step - 1) * terms.batch : step * terms.batch]


def in_scope(path: str, scope: Sequence[str]) -> bool:
    """Whether ``path`` is a file under a scope folder. A path that is not a clean relative
    one (absolute, or with an empty, ``.`` or ``..`` part: ``harness/../corpus/x``) is in
    no scope: a tree never holds one, so a log naming one lies about what changed."""
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    return any(path.startswith(normal_scope(folder)) for folder in scope)


def outside_scope(paths: Iterable[str], scope: Sequence[str]) -> list[str]:
    return sorted(p for p in paths if not in_scope(p, scope))


def in_situ(per_case: Iterable[Sequence[Fraction]]) -> Fraction:
    """J: the mean over cases of each case's mean score (a fraction, not a percentage)."""
    return rules.mean([rules.mean(list(scores)) for scores in per_case])


# --------------------------------------------------------------------------- the fold

Phase = Literal["solve", "scoring", "evolve", "done", "scored"]


@dataclass
class EvolveLog:
    """A solve-evolve run folded event by event (see the module's doc)."""

    terms: EvolveTerms
    seed: str
    head: str = ""  # H_{t-1} of the step under way, H_t once step t closed
    step: int = 0  # steps begun
    phase: Phase = "solve"
    request_id: str | None = None
    expected: set[str] = field(default_factory=set)  # the open step's cases not yet scored
    projection: str | None = None  # D_t's digest
    commit: CandidateCommitted | None = None  # the open step's commit, before StepClosed
    tokens: int = 0  # the evolver's tokens since D_t
    scores: dict[str, list[Fraction]] = field(default_factory=dict)
    closed: list[StepClosed] = field(default_factory=list)
    in_situ: InSituScored | None = None

    def __post_init__(self) -> None:
        self.head = self.head or self.seed

    @property
    def done(self) -> bool:
        return self.phase in ("done", "scored")

    def where(self) -> str:
        """Where the run stands, in words."""
        return {
            "solve": f"step {self.step + 1} has not begun",
            "scoring": f"step {self.step} is being scored",
            "evolve": f"step {self.step} awaits the evolver",
            "done": "the last step has closed",
            "scored": "the run is scored",
        }[self.phase]

    def apply(self, payload: Model) -> list[Problem]:
        """Fold one event's payload; what is wrong with it (empty: nothing)."""
        if isinstance(payload, CandidateCommitted):
            return self._commit(payload)
        if isinstance(payload, EvaluationRequested):
            return self._request(payload)
        if isinstance(payload, TrialCompleted):
            return self._trial(payload)
        if isinstance(payload, DisclosureProjected):
            return self._projected(payload)
        if isinstance(payload, GatewayCall):
            if payload.scope == "optimizer" and self.phase == "evolve":
                self.tokens += payload.tokens.total
            return []
        if isinstance(payload, StepClosed):
            return self._close(payload)
        if isinstance(payload, InSituScored):
            return self._scored(payload)
        if isinstance(payload, (CandidateNominated, RunScored)):
            name = type(payload).__name__
            return [Problem(ORDER, f"{name} in a solve-evolve run, which nominates nothing")]
        return []

    def _commit(self, c: CandidateCommitted) -> list[Problem]:
        if c.index == 0:
            return []
        if self.phase != "evolve":
            return [
                Problem(
                    ORDER,
                    f"candidate {c.candidate[:12]} committed outside an evolver's turn "
                    f"({self.where()})",
                )
            ]
        if self.commit is not None:
            return [
                Problem(
                    ORDER,
                    f"a second commit in step {self.step} ({c.candidate[:12]} after "
                    f"{self.commit.candidate[:12]})",
                )
            ]
        self.commit = c
        problems = []
        if c.parent != self.head:
            problems.append(
                Problem(
                    SCOPE,
                    f"step {self.step}'s commit {c.candidate[:12]} has parent "
                    f"{(c.parent or 'none')[:12]}, not H_{self.step - 1} {self.head[:12]}",
                )
            )
        outside = outside_scope(c.changed_paths, self.terms.scope)
        if outside:
            problems.append(
                Problem(
                    SCOPE,
                    f"step {self.step}'s commit {c.candidate[:12]} changes {outside[0]!r}, "
                    f"outside the editable scope {', '.join(self.terms.scope)}",
                )
            )
        return problems

    def _request(self, req: EvaluationRequested) -> list[Problem]:
        if req.decision != "accepted":
            return [Problem(ORDER, f"request {req.request_id} rejected: no step is refused")]
        if self.phase != "solve":
            return [
                Problem(
                    ORDER,
                    f"request {req.request_id} while {self.where()}",
                )
            ]
        self.step += 1
        t = self.step
        problems = []
        want = batch_of(self.terms, t)
        if req.split != self.terms.split or list(req.case_ids) != want or req.attempts != 1:
            problems.append(
                Problem(
                    ORDER,
                    f"step {t}'s request {req.request_id} scores {req.split} cases "
                    f"{_ids(req.case_ids)} x {req.attempts}, not X_{t} = {_ids(want)} x 1",
                )
            )
        if req.candidate != self.head:
            problems.append(
                Problem(
                    PARENT,
                    f"step {t}'s trials run {req.candidate[:12]}, not H_{t - 1} {self.head[:12]}",
                )
            )
        self.phase = "scoring"
        self.request_id = req.request_id
        self.expected = set(req.case_ids)
        return problems

    def _trial(self, trial: TrialCompleted) -> list[Problem]:
        label = f"trial {trial.trial_id} ({trial.case_id})"
        if self.phase != "scoring" or trial.request_id != self.request_id:
            return [
                Problem(
                    FIXED,
                    f"{label} scored while {self.where()}: "
                    "after the evidence that disclosed its step, or of no step",
                )
            ]
        problems = []
        if trial.candidate != self.head:
            problems.append(
                Problem(
                    PARENT,
                    f"{label} of step {self.step} ran {trial.candidate[:12]}, not "
                    f"H_{self.step - 1} {self.head[:12]}",
                )
            )
        self.expected.discard(trial.case_id)
        self.scores.setdefault(trial.case_id, []).append(trial.score)
        return problems

    def _projected(self, proj: DisclosureProjected) -> list[Problem]:
        if self.phase != "scoring" or proj.request_id != self.request_id:
            return [
                Problem(
                    ORDER,
                    f"evidence of request {proj.request_id} disclosed while {self.where()}",
                )
            ]
        problems = []
        if self.expected:
            problems.append(
                Problem(
                    FIXED,
                    f"step {self.step}'s evidence disclosed before its cases "
                    f"{_ids(sorted(self.expected))} were scored",
                )
            )
        self.phase = "evolve"
        self.projection = proj.projection_digest
        self.commit = None
        self.tokens = 0
        return problems

    def _close(self, closed: StepClosed) -> list[Problem]:
        t = self.step
        if self.phase != "evolve":
            return [
                Problem(
                    ORDER,
                    f"StepClosed of step {closed.step} while {self.where()}",
                )
            ]
        problems = []
        if closed.step != t:
            problems.append(
                Problem(ORDER, f"StepClosed names step {closed.step}; the step open is {t}")
            )
        if closed.request_id != self.request_id or closed.projection_digest != self.projection:
            problems.append(
                Problem(
                    ORDER,
                    f"StepClosed of step {t} names request {closed.request_id} and evidence "
                    f"{closed.projection_digest[:12]}, not the step's",
                )
            )
        if closed.parent != self.head:
            problems.append(
                Problem(
                    SCOPE,
                    f"step {t} closes on parent {closed.parent[:12]}, not H_{t - 1} "
                    f"{self.head[:12]}",
                )
            )
        if closed.outcome == "committed":
            if self.commit is None or self.commit.candidate != closed.candidate:
                problems.append(
                    Problem(
                        ORDER,
                        f"step {t} closes as committed {closed.candidate[:12]} with no such "
                        "commit in its turn",
                    )
                )
        elif self.commit is not None or closed.candidate != closed.parent:
            problems.append(Problem(ORDER, f"step {t} closes as unchanged but its harness changed"))
        if closed.evolver_tokens != self.tokens:
            problems.append(
                Problem(
                    BUDGET,
                    f"step {t} records {closed.evolver_tokens} evolver tokens; its calls "
                    f"sum to {self.tokens}",
                )
            )
        cap = self.terms.step_tokens
        if closed.outcome == "committed" and cap is not None and self.tokens > cap:
            problems.append(
                Problem(
                    BUDGET,
                    f"step {t} committed after {self.tokens} evolver tokens, over the "
                    f"per-step budget {cap}",
                )
            )
        self.closed.append(closed)
        self.head = closed.candidate
        self.commit = None
        self.phase = "done" if t >= self.terms.steps else "solve"
        return problems

    def per_case(self) -> list[tuple[str, list[Fraction]]]:
        """The scores of every stream case scored so far, in stream order."""
        return [(c, self.scores[c]) for c in self.terms.stream if c in self.scores]

    def _scored(self, scored: InSituScored) -> list[Problem]:
        if self.phase != "done":
            return [Problem(ORDER, f"InSituScored while {self.where()}")]
        self.phase = "scored"
        self.in_situ = scored
        recorded = [(c.case_id, list(c.scores)) for c in scored.per_case]
        if recorded != self.per_case():
            return [Problem(SCORE, "InSituScored's per-case scores are not the steps' trials")]
        j = in_situ(s for _, s in recorded)
        if scored.j != j:
            return [
                Problem(
                    SCORE,
                    f"InSituScored says J {rational_to_str(scored.j)}; the trials give "
                    f"{rational_to_str(j)}",
                )
            ]
        delta = None if scored.base is None else j - scored.base
        if scored.delta != delta:
            return [Problem(SCORE, "InSituScored's delta is not J - Base")]
        return []


def solve_refusal(log: EvolveLog) -> Refusal | None:
    """None when the next batch may be scored now; else why not."""
    if log.done:
        return Refusal(
            refusals.EVOLVE_DONE, f"all {log.terms.steps} steps of the stream have been run"
        )
    if log.phase == "evolve":
        return Refusal(
            refusals.EVOLVE_OUT_OF_TURN,
            f"step {log.step} awaits the evolver's commit or 'unchanged' first",
        )
    if log.phase == "scoring":
        return Refusal(refusals.EVOLVE_OUT_OF_TURN, f"step {log.step} is still being scored")
    return None


def close_refusal(
    log: EvolveLog, step: int, parent: str | None, changed: Sequence[str] | None
) -> Refusal | None:
    """None when step ``step`` may close now with a commit on ``parent`` changing
    ``changed`` (``changed`` None: "unchanged"); else why not."""
    if log.phase != "evolve" or step != log.step:
        awaiting = log.where()
        return Refusal(
            refusals.EVOLVE_OUT_OF_TURN, f"step {step} is not awaiting the evolver: {awaiting}"
        )
    if changed is None:
        return None
    if parent != log.head:
        return Refusal(
            refusals.EVOLVE_WRONG_PARENT,
            f"the commit of step {step} must have parent H_{step - 1} = {log.head[:12]}, "
            f"not {(parent or 'none')[:12]}",
        )
    outside = outside_scope(changed, log.terms.scope)
    if outside:
        return Refusal(
            refusals.EVOLVE_OUT_OF_SCOPE,
            f"{outside[0]!r} is outside the editable scope ({', '.join(log.terms.scope)})",
        )
    cap = log.terms.step_tokens
    if cap is not None and log.tokens > cap:
        return Refusal(
            refusals.EVOLVE_STEP_BUDGET,
            f"step {step}'s evolver used {log.tokens} tokens, over the per-step budget {cap}: "
            "only 'unchanged' closes it",
        )
    return None


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:4]) + (", ..." if len(ids) > 4 else "")
    return f"[{shown}]"


__all__ = [
    "NONE_OPTIMIZER",
    "PROTOCOL",
    "EvolveLog",
    "Problem",
    "batch_of",
    "close_refusal",
    "in_scope",
    "in_situ",
    "normal_scope",
    "open_problem",
    "solve_refusal",
    "stream_digest",
]
