"""Held-out scoring: the nomination, the test split scored K times, RunScored, RunClosed.

A run nominates exactly once. The nominee is scored on every test case K times (a
held-out EvaluationRequested outside the search budget); its trials and RunScored are
one append, then the run is closed. A nomination cut short (the server stopped during
held-out scoring, or before it closed the run) is finished by nominating the same
candidate again: the recorded nomination and held-out request are reused and the trials
run under new trial ids. Nominations of one run take turns, across threads and processes
(a lock file), so the held-out trials never run twice.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from holedger.errors import LedgerConflictError, NotFoundError, PolicyError, Unavailable
from holedger.protocol import rules
from holedger.replay.report import counted
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import CandidateNominated, CaseScores, EvaluationRequested, RunScored
from holedger.server.core import MAX_DECIDE_ATTEMPTS, ServerCore
from holedger.server.dispatch import Item, trial_items
from holedger.server.locks import nomination_lock
from holedger.server.recovery import record_left_requests
from holedger.server.state import RunState


@dataclass(frozen=True)
class ScoredRun:
    run_id: str
    candidate: str
    k: int
    e_h_plus: Fraction
    e_h0: Fraction
    g: Fraction | None
    per_case: dict[str, list[Fraction]]
    # The standard errors of the K round means (A3): E(H+)'s, and the pinned E(H0)'s.
    e_h_plus_se: str | None = None
    e_h0_se: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "candidate": self.candidate,
            "k": self.k,
            "e_h_plus": rational_to_str(self.e_h_plus),
            "e_h_plus_se": self.e_h_plus_se,
            "e_h0": rational_to_str(self.e_h0),
            "e_h0_se": self.e_h0_se,
            "g": None if self.g is None else rational_to_str(self.g),
            "per_case": {c: [rational_to_str(s) for s in v] for c, v in self.per_case.items()},
        }


def nominate(core: ServerCore, run_id: str, candidate: str, *, wait: bool = True) -> ScoredRun:
    """Nominate once, score the candidate on every test case K times, close the run.

    One nomination that comes while another scores (a client retrying a slow call) waits,
    then finds the run closed. With ``wait`` False (the HTTP API, whose threads are shared
    by every run) it is refused at once as Unavailable instead.
    """
    core.run_task(run_id)  # a run this home does not hold is refused before any lock
    with core.work(), nomination_lock(core.nomination_lock_path(run_id), wait=wait):
        return _nominate(core, run_id, candidate)


def _nominate(core: ServerCore, run_id: str, candidate: str) -> ScoredRun:
    opened = core.ledger.run_terms(run_id)
    task = core.run_task(run_id)
    terms = task.terms

    def decide(st: RunState) -> tuple[list[Item], str]:
        if st.closed or (
            st.nominated is not None and st.resolve_candidate(candidate) != st.nominated
        ):
            raise PolicyError(
                f"run {run_id} already has a nomination ({(st.nominated or '?')[:12]})",
                hint="a run nominates exactly once",
            )
        commit = st.resolve_candidate(candidate)
        if commit is None:
            raise NotFoundError(f"no committed candidate {candidate!r} in run {run_id}")
        if st.scored is None and setup_error is not None:
            raise setup_error  # nothing recorded: held-out scoring could not run
        if st.nominated is not None:
            return [], commit  # resuming the nomination cut short
        if st.pending:  # (those a stopped server left were recorded just before)
            raise Unavailable(
                f"run {run_id} has {counted(len(st.pending), 'evaluation')} still "
                "running; the nomination would close the run under it",
                hint="nominate once it is recorded",
            )
        return [("CandidateNominated", CandidateNominated(candidate=commit), "server")], commit

    record_left_requests(core, run_id)  # a search request a stopped server left, first
    runner, setup_error = core.try_trial_runner(run_id, task)
    commit = core.decide(run_id, decide)
    scored_already = core.states.current(run_id).scored
    if scored_already is not None:
        return close_scored(core, run_id, scored_already)
    test_cases = {c.id: c for c in task.cases("test")}
    ids = list(test_cases)
    request_id = f"heldout-{uuid.uuid4().hex[:12]}"
    cost = rules.request_cost(terms.split_sizes["test"], len(ids), terms.k)

    resumed = False

    def held_out(st: RunState) -> tuple[list[Item], EvaluationRequested]:
        nonlocal resumed
        if st.heldout is not None:
            resumed = True
            return [], st.heldout  # resuming: its trials were never recorded
        reason = rules.request_problem(
            terms, "test", ids, terms.k, nominated=True, known_cases=set(test_cases)
        )
        if reason:
            raise PolicyError(f"held-out scoring impossible: {reason}")
        payload = EvaluationRequested(
            request_id=request_id,
            candidate=commit,
            split="test",
            case_ids=ids,
            attempts=terms.k,
            cost=cost,
            budget_before=st.used,
            decision="accepted",
        )
        return [("EvaluationRequested", payload, "server")], payload

    request = core.decide(run_id, held_out)
    outcomes = core.run_trials(runner, run_id, request, test_cases, resumed=resumed)
    per_case: dict[str, list[Fraction]] = {c: [] for c in ids}
    for outcome in sorted(outcomes, key=lambda o: (o.completed.case_id, o.completed.attempt)):
        per_case[outcome.completed.case_id].append(outcome.completed.score)
    e_plus = rules.expected_score(per_case)
    if opened.seed_baseline is not None:
        e0 = opened.seed_baseline.e_h0
    elif opened.optimizer == rules.BASELINE_OPTIMIZER:
        e0 = e_plus  # the baseline run measures E(H0) itself
    else:
        raise PolicyError(f"run {run_id} has no pinned seed baseline to score against")
    gain = rules.normalized_gain(e_plus, e0)
    scored = RunScored(
        candidate=commit,
        k=terms.k,
        per_case=[CaseScores(case_id=c, scores=s) for c, s in per_case.items()],
        e_h_plus=e_plus,
        e_h0=e0,
        g=gain,
        # A3's error bars: E(H+)'s from these trials, E(H0)'s as pinned (when it is).
        e_h_plus_error=rules.round_error(per_case.values()),
        e_h0_error=None if opened.seed_baseline is None else opened.seed_baseline.e_h0_error,
    )
    core.append(run_id, [*trial_items(outcomes), ("RunScored", scored, "server")])
    return close_scored(core, run_id, scored)


def close_scored(core: ServerCore, run_id: str, scored: RunScored) -> ScoredRun:
    """Close a scored run (RunClosed "completed" with the score's summary)."""
    per_case = {c.case_id: list(c.scores) for c in scored.per_case}
    result = ScoredRun(
        run_id,
        scored.candidate,
        scored.k,
        scored.e_h_plus,
        scored.e_h0,
        scored.g,
        per_case,
        e_h_plus_se=None if scored.e_h_plus_error is None else scored.e_h_plus_error.se,
        e_h0_se=None if scored.e_h0_error is None else scored.e_h0_error.se,
    )
    summary = {k: v for k, v in result.as_json().items() if k != "per_case"}
    for _ in range(MAX_DECIDE_ATTEMPTS):
        try:
            core.ledger.close_run(run_id, "completed", summary)
            break
        except LedgerConflictError:
            continue
    return result
