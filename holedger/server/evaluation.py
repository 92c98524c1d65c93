"""Search evaluations: a budgeted request on the dev or val split, its trials, and what
the optimizer is shown of them.

A request is gated by the rules and the budget and recorded (EvaluationRequested); a
refused one is recorded as rejected and raised. An accepted one holds its request lock
(:mod:`holedger.server.locks`) from before it is recorded until its trials and projection
are, appended together as one decision after the last trial.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from holedger.errors import BudgetExceededError, NotFoundError, PolicyError, UsageError
from holedger.protocol import refusals, rules
from holedger.schemas.events import EvaluationRequested
from holedger.server import MAX_ATTEMPTS
from holedger.server.core import ServerCore, open_for_search
from holedger.server.dispatch import EvaluationInterrupted, Item, projected, trial_items
from holedger.server.locks import request_lock
from holedger.server.recovery import record_left_requests
from holedger.server.state import RunState
from holedger.server.trials import outcome_warnings


@dataclass(frozen=True)
class Evaluation:
    request_id: str
    candidate: str
    split: str
    policy: str
    projection: dict[str, Any]
    projection_digest: str
    cost: dict[str, Any]
    budget_after: dict[str, Any]
    # What went wrong in dev trials (trials.outcome_warnings), for the command line; empty
    # when nothing did, and always for val, which discloses its aggregate mean only. Not
    # in the API's answer, which is the recorded projection and the budget, nothing more.
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The evaluation as the API and ``holedger eval --json`` give it."""
        return {
            "request_id": self.request_id,
            "candidate": self.candidate,
            "split": self.split,
            "policy": self.policy,
            "projection": self.projection,
            "projection_digest": self.projection_digest,
            "cost": self.cost,
            "budget_used": self.budget_after,
        }


def evaluate(
    core: ServerCore,
    run_id: str,
    candidate: str,
    split: str,
    case_ids: Sequence[str] | None,
    attempts: int,
) -> Evaluation:
    """Gate, record, run the trials, project, return the projection (module's doc)."""
    if split not in ("dev", "val", "test"):
        raise UsageError(f"unknown split {split!r}", hint="use dev or val")
    if attempts < 1:
        raise UsageError(
            f"attempts must be at least 1, got {attempts}",
            hint="ask for one attempt per case or more",
        )
    if attempts > MAX_ATTEMPTS:
        # Not recorded: no budget holds that many, and its record would cost every
        # replay of the run (or, past 2**53, could not be written at all).
        raise UsageError(
            f"attempts must be at most {MAX_ATTEMPTS}, got {attempts}",
            hint="ask for fewer attempts; the budget counts each one",
        )
    state = core.states.current(run_id)
    open_for_search(state)
    commit = state.resolve_candidate(candidate)
    if commit is None:
        raise NotFoundError(
            f"no committed candidate {candidate!r} in run {run_id}",
            hint="commit it first, or give 'seed' or a unique commit prefix",
        )
    task = core.run_task(run_id)
    terms = task.terms
    split_cases = {c.id: c for c in task.cases(split)}
    ids = list(case_ids) if case_ids else list(split_cases)
    unknown = sorted(set(ids) - set(split_cases))
    if unknown:
        # Not recorded: replay cannot re-check membership without the task's case list,
        # so a request naming unknown cases is malformed, not a protocol decision.
        raise NotFoundError(
            f"case {unknown[0]!r} is not in the {split} split",
            hint="GET the run for the dev and val case ids",
        )
    request_id = f"req-{uuid.uuid4().hex[:16]}"
    cost = rules.request_cost(terms.split_sizes[split], len(ids), attempts)  # type: ignore[index]

    def decide(st: RunState) -> tuple[list[Item], EvaluationRequested]:
        if st.closed or st.nominated is not None:
            raise PolicyError(f"run {run_id} has a nomination; no more search requests")
        refusal = rules.request_problem(
            terms, split, ids, attempts, nominated=False, known_cases=None
        ) or rules.budget_decision(terms.budget, st.used, split, cost)
        if refusal is None and setup_error is not None:
            raise setup_error  # nothing recorded: the request could not get its trials
        payload = EvaluationRequested(
            request_id=request_id,
            candidate=commit,
            split=split,
            case_ids=ids,
            attempts=attempts,
            cost=cost,
            budget_before=st.used,
            decision="rejected" if refusal else "accepted",
            reason=refusal.text if refusal else None,
            code=refusal.code if refusal else None,
        )
        return [("EvaluationRequested", payload, "server")], payload

    record_left_requests(core, run_id)  # a request a stopped server left is recorded first
    runner, setup_error = core.try_trial_runner(run_id, task)
    # Held from before the request is recorded until its projection is: a request
    # without a projection whose lock is free was left by a server that stopped.
    with request_lock(core.request_lock_path(run_id, request_id)):
        request = core.decide(run_id, decide)
        if request.decision == "rejected":
            code = request.code or ""
            error = BudgetExceededError if code.startswith("budget.") else PolicyError
            raise error(
                f"request {request_id} rejected: {request.reason or 'rejected'}",
                hint=_hint_for(code),
            )
        interrupted: EvaluationInterrupted | None = None
        try:
            outcomes = core.run_trials(runner, run_id, request, split_cases)
        except EvaluationInterrupted as exc:  # record the request whole, then stop
            interrupted, outcomes = exc, exc.outcomes
        projection = projected(request, terms.disclosure, outcomes)
        items = [*trial_items(outcomes), ("DisclosureProjected", projection, "server")]
        if not core.record_request(run_id, request_id, items):
            raise PolicyError(  # cannot happen while the request's lock is held
                f"request {request_id} of run {run_id} can no longer be recorded: the run "
                "was closed, or another process recorded it",
                hint="replay the run to see what it holds",
            )
        if interrupted is not None:
            raise interrupted
        after = rules.add_use(request.budget_before, split, cost)
        return Evaluation(
            request_id=request_id,
            candidate=commit,
            split=split,
            policy=projection.policy,
            projection=projection.projection,
            projection_digest=projection.projection_digest,
            cost=cost.model_dump(mode="json"),
            budget_after=after.model_dump(mode="json"),
            warnings=outcome_warnings(outcomes) if split == "dev" else [],
        )


def _hint_for(code: str) -> str:
    if code.startswith("budget."):
        return "see the remaining budget with 'holedger run show RUN' or GET /v1/runs/RUN/budget"
    if code == refusals.TEST_SEALED:
        return "the test split is only scored after 'holedger nominate'"
    return "fix the request"
