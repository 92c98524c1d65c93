"""Solve-evolve runs on the server: open, score each batch, take the evolver's one change.

A solve-evolve run (docs/PROTOCOL.md, Solve-evolve runs) feeds a pinned stream of dev
cases in batches. For step t the server scores batch X_t under H_{t-1} (one accepted
EvaluationRequested, its trials, the DisclosureProjected that is the evidence D_t, all
recorded before anything is shown), then takes exactly one of: a commit on H_{t-1} whose
changed paths lie inside the editable scope (CandidateCommitted then StepClosed
``committed``), or ``unchanged`` (StepClosed alone). After the last step it records
InSituScored (J, and Base from the pinned NONE run) and closes the run.

Every decision is taken with the pure rules of :mod:`holedger.protocol.evolve` on the
run's events folded up to the head it appends at (``RunService._decide``), so a commit out
of turn, out of scope, on another parent or over the step's token budget is refused with a
stable code (:class:`StepRefused`) and nothing is recorded.

The NONE run of a stream (the seed throughout, no evolver) is run once per task digest and
stream digest and pinned in every later run of that stream, as the seed baseline is.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from holedger.errors import NotFoundError, PolicyError, UsageError
from holedger.ledger.records import Record
from holedger.protocol import evolve, rules
from holedger.protocol.refusals import Refusal
from holedger.sandboxes import get_backend
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import (
    CandidateCommitted,
    CaseScores,
    EvaluationRequested,
    EvolveTerms,
    InSituScored,
    Model,
    NoneRun,
    OptimizerDescriptor,
    StepClosed,
    payload_model,
)
from holedger.server import lifecycle
from holedger.server.candidates import (
    CandidateRefused,
    FileMap,
    changed_paths,
    entrypoint_problem,
    read_directory,
)
from holedger.server.core import ServerCore
from holedger.server.dispatch import EvaluationInterrupted, Item, projected, trial_items
from holedger.server.lifecycle import OpenedRun
from holedger.server.locks import request_lock
from holedger.server.recovery import record_left_requests
from holedger.server.service import RunService
from holedger.server.state import RunState
from holedger.server.trees import immutable_refusal

FOLDED = frozenset(
    {
        "CandidateCommitted",
        "EvaluationRequested",
        "TrialCompleted",
        "DisclosureProjected",
        "GatewayCall",
        "StepClosed",
        "InSituScored",
        "CandidateNominated",
        "RunScored",
    }
)


class StepRefused(PolicyError):
    """A step refused by the rules (nothing recorded); ``code`` is the refusal's code."""

    def __init__(self, refusal: Refusal, hint: str | None = None) -> None:
        super().__init__(refusal.text, hint=hint)
        self.code = refusal.code


@dataclass(frozen=True)
class Evidence:
    """D_t as the evolver is shown it: the step's scored batch, recorded before shown."""

    step: int
    steps: int
    candidate: str  # H_{t-1}, the harness that scored the batch
    request_id: str
    case_ids: list[str]
    projection: dict[str, Any]
    projection_digest: str

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "steps": self.steps,
            "candidate": self.candidate,
            "request_id": self.request_id,
            "case_ids": self.case_ids,
            "projection": self.projection,
            "projection_digest": self.projection_digest,
        }


@dataclass(frozen=True)
class ClosedStep:
    step: int
    outcome: str
    parent: str
    candidate: str
    changed_paths: list[str]
    finished: InSituScored | None  # the run's score, when this was its last step

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "outcome": self.outcome,
            "parent": self.parent,
            "candidate": self.candidate,
            "changed_paths": self.changed_paths,
            "state": "closed" if self.finished is not None else "open",
            "in_situ": None if self.finished is None else in_situ_json(self.finished),
        }


def in_situ_json(scored: InSituScored) -> dict[str, Any]:
    def text(value: Any) -> str | None:
        return None if value is None else rational_to_str(value)

    return {"j": text(scored.j), "base": text(scored.base), "delta": text(scored.delta)}


def evolve_terms(opened_terms: Any) -> EvolveTerms:
    terms = opened_terms.solve_evolve
    if terms is None:
        raise StepRefused(
            Refusal("evolve.not_solve_evolve", "this run is a search run, not a solve-evolve run"),
            hint="open one with 'holedger run open --protocol solve-evolve'",
        )
    assert isinstance(terms, EvolveTerms)
    return terms


class EvolveRuns:
    """Solve-evolve operations over a :class:`RunService` (its ledger, repos and trials)."""

    def __init__(self, service: RunService) -> None:
        self.service = service
        self.core = service.core

    # ------------------------------------------------------------------ folding

    def fold(self, run_id: str, upto: int | None = None) -> evolve.EvolveLog:
        """The run's steps folded from its events before seq ``upto`` (all: None)."""
        opened = self.service.ledger.run_terms(run_id)
        log = evolve.EvolveLog(evolve_terms(opened), opened.terms.seed_commit)
        for rec in self.service.ledger.records(run_id):
            if upto is not None and rec.seq >= upto:
                break
            payload = _payload(rec)
            if payload is not None:
                log.apply(payload)
        return log

    # ------------------------------------------------------------------ open

    def terms_for(
        self,
        task_ref: str,
        *,
        batch: int,
        steps: int,
        scope: Sequence[str] | None,
        step_tokens: int | None,
        stream: Sequence[str] | None,
    ) -> EvolveTerms:
        """The terms a run would pin, or UsageError saying what is wrong with them."""
        task = self.service.task(task_ref)
        dev = [c.id for c in task.cases("dev")]
        offered = list(stream) if stream is not None else dev
        unknown = [c for c in offered if c not in set(dev)]
        if unknown:
            raise UsageError(
                f"stream case {unknown[0]!r} is not a dev case of {task.terms.task_id}",
                hint="a stream lists dev case ids, one a line",
            )
        seed_paths = list(read_directory(task.seed_dir, self.service.tree_limits))
        immutable = task.terms.immutable_paths
        if scope is None:  # every top folder the task lets a harness change
            tops = sorted({p.split("/")[0] + "/" for p in seed_paths if "/" in p})
            scope = [t for t in tops if not any(_overlap(t, i) for i in immutable)]
        problem = evolve.open_problem(offered, batch, steps, scope, seed_paths, immutable)
        if problem is not None:
            raise UsageError(problem[0], hint=problem[1])
        used = offered[: batch * steps]
        if step_tokens is not None and step_tokens < 0:
            raise UsageError("--step-tokens must not be negative")
        return EvolveTerms(
            stream=used,
            stream_digest=evolve.stream_digest("dev", used),
            batch=batch,
            steps=steps,
            scope=sorted({evolve.normal_scope(s) for s in scope}),
            step_tokens=step_tokens,
        )

    def open_run(
        self,
        task_ref: str,
        terms: EvolveTerms,
        *,
        optimizer: str = "unnamed",
        backend: str | None = None,
        descriptor: OptimizerDescriptor | None = None,
        none: bool = True,
    ) -> OpenedRun:
        """RunOpened pinning the stream (and its NONE run, unless ``none`` is False or
        this is one), then the seed as candidate 0, as every run begins."""
        svc = self.service
        if Path(task_ref).is_dir():
            task_ref = str(Path(task_ref).resolve())
        svc.task(task_ref)  # an unknown task is refused before anything else
        backend = get_backend(backend or svc.default_backend).name
        if none and optimizer != evolve.NONE_OPTIMIZER:
            terms = terms.model_copy(
                update={"none_run": self.ensure_none(task_ref, terms, backend=backend)}
            )
        return lifecycle.open_run(
            self.core,
            task_ref,
            optimizer=optimizer,
            backend=backend,
            baseline=False,
            descriptor=descriptor,
            solve_evolve=terms,
        )

    # ------------------------------------------------------------------ solve

    def solve(self, run_id: str) -> Evidence:
        """Score the next batch under H_{t-1}, record it with its evidence, return D_t."""
        svc = self.core
        with svc.work():
            state = svc.states.current(run_id)
            terms = evolve_terms(state.opened)
            task = svc.run_task(run_id)
            cases = {c.id: c for c in task.cases("dev")}
            record_left_requests(svc, run_id)
            runner, setup_error = svc.try_trial_runner(run_id, task)
            request_id = f"step-{uuid.uuid4().hex[:16]}"

            def decide(st: RunState) -> tuple[list[Item], tuple[int, EvaluationRequested]]:
                log = self.fold(run_id, st.next_seq)
                refusal = evolve.solve_refusal(log)
                if refusal is not None:
                    raise StepRefused(refusal, hint=_hint(refusal))
                if st.closed:
                    raise PolicyError(f"run {run_id} is closed")
                if setup_error is not None:
                    raise setup_error
                step = log.step + 1
                ids = evolve.batch_of(terms, step)
                payload = EvaluationRequested(
                    request_id=request_id,
                    candidate=log.head,
                    split="dev",
                    case_ids=ids,
                    attempts=1,
                    cost=rules.request_cost(task.terms.split_sizes["dev"], len(ids), 1),
                    budget_before=st.used,
                    decision="accepted",
                )
                return [("EvaluationRequested", payload, "server")], (step, payload)

            with request_lock(svc.request_lock_path(run_id, request_id)):
                step, request = svc.decide(run_id, decide)
                interrupted: EvaluationInterrupted | None = None
                try:
                    outcomes = svc.run_trials(runner, run_id, request, cases)
                except EvaluationInterrupted as exc:
                    interrupted, outcomes = exc, exc.outcomes
                evidence = projected(request, task.terms.disclosure, outcomes)
                items = [*trial_items(outcomes), ("DisclosureProjected", evidence, "server")]
                if not svc.record_request(run_id, request_id, items):
                    raise PolicyError(f"step {step} of run {run_id} could not be recorded")
                if interrupted is not None:
                    raise interrupted
        return Evidence(
            step,
            terms.steps,
            request.candidate,
            request_id,
            list(request.case_ids),
            evidence.projection,
            evidence.projection_digest,
        )

    # ------------------------------------------------------------------ evolve

    def commit(self, run_id: str, step: int, files: FileMap, parent: str | None) -> ClosedStep:
        """Step ``step``'s one commit: ``files`` (the whole tree) on ``parent`` (H_{t-1})."""
        svc = self.core
        state = svc.states.current(run_id)
        evolve_terms(state.opened)
        log = self.fold(run_id, state.next_seq)
        head = log.head
        parent_id = head if parent is None else state.resolve_candidate(parent)
        if parent_id is None:
            raise NotFoundError(f"no committed candidate {parent} in run {run_id}")
        early = evolve.close_refusal(log, step, parent_id, [])
        if early is not None:
            raise StepRefused(early, hint=_hint(early))
        task = svc.run_task(run_id)
        problem = entrypoint_problem(files, task.terms.entrypoint)
        if problem:
            raise CandidateRefused(problem, hint="keep the task's entrypoint module")
        repo = svc.repo(run_id)
        made = repo.commit(files, parent_id, keep=False)
        listing = repo.listing(made.commit)
        refusal = immutable_refusal(
            repo.listing(state.seed_commit), listing, task.terms.immutable_paths
        )
        if refusal is not None:
            raise refusal
        changed = changed_paths(repo.listing(parent_id), listing)
        if not changed:
            raise UsageError(
                f"the commit of step {step} changes nothing",
                hint="close the step with 'unchanged' instead",
            )

        def decide(st: RunState) -> tuple[list[Item], ClosedStep]:
            now = self.fold(run_id, st.next_seq)
            refused = evolve.close_refusal(now, step, parent_id, changed)
            if refused is not None:
                raise StepRefused(refused, hint=_hint(refused))
            if made.commit in st.candidates:
                raise UsageError(f"candidate {made.commit[:12]} was committed before")
            committed = CandidateCommitted(
                candidate=made.commit,
                index=len(st.candidates),
                tree=made.tree,
                parent=parent_id,
                changed_paths=changed,
                immutable_ok=True,
            )
            closed = _step_closed(now, "committed", made.commit)
            result = ClosedStep(step, "committed", parent_id, made.commit, changed, None)
            return [
                ("CandidateCommitted", committed, "server"),
                ("StepClosed", closed, "server"),
            ], result

        result = svc.decide(run_id, decide)
        repo.keep(made.commit)
        return self._after_close(run_id, result)

    def commit_changes(
        self, run_id: str, step: int, changes: Mapping[str, Any], parent: str | None
    ) -> ClosedStep:
        """Step ``step``'s one commit, as changes on top of ``parent`` (default H_{t-1})."""
        from holedger.server.trees import changes_on_parent

        base = parent or self.fold(run_id).head
        files = changes_on_parent(self.service, run_id, base, changes)
        return self.commit(run_id, step, files, base)

    def unchanged(self, run_id: str, step: int) -> ClosedStep:
        """Close step ``step`` with no change: H_t = H_{t-1}."""

        def decide(st: RunState) -> tuple[list[Item], ClosedStep]:
            log = self.fold(run_id, st.next_seq)
            refused = evolve.close_refusal(log, step, None, None)
            if refused is not None:
                raise StepRefused(refused, hint=_hint(refused))
            closed = _step_closed(log, "unchanged", log.head)
            return [("StepClosed", closed, "server")], ClosedStep(
                step, "unchanged", log.head, log.head, [], None
            )

        evolve_terms(self.service.states.current(run_id).opened)
        result = self.core.decide(run_id, decide)
        return self._after_close(run_id, result)

    def _after_close(self, run_id: str, result: ClosedStep) -> ClosedStep:
        scored = self.finish(run_id)
        if scored is None:
            return result
        return ClosedStep(
            result.step,
            result.outcome,
            result.parent,
            result.candidate,
            result.changed_paths,
            scored,
        )

    def finish(self, run_id: str) -> InSituScored | None:
        """After the last step: InSituScored, then RunClosed; None before it."""
        svc = self.core
        opened = svc.ledger.run_terms(run_id)
        terms = evolve_terms(opened)

        def decide(st: RunState) -> tuple[list[Item], InSituScored | None]:
            log = self.fold(run_id, st.next_seq)
            if log.phase == "scored":
                return [], log.in_situ
            if log.phase != "done" or st.closed:
                return [], None
            per_case = log.per_case()
            j = evolve.in_situ(s for _, s in per_case)
            if terms.none_run is not None:
                base = terms.none_run.j
            elif opened.optimizer == evolve.NONE_OPTIMIZER:
                base = j  # the NONE run measures Base itself
            else:
                base = None
            scored = InSituScored(
                per_case=[CaseScores(case_id=c, scores=s) for c, s in per_case],
                j=j,
                base=base,
                delta=None if base is None else j - base,
            )
            return [("InSituScored", scored, "server")], scored

        scored = svc.decide(run_id, decide)
        if scored is None:
            return None
        if not svc.states.current(run_id).closed:
            log = self.fold(run_id)
            summary = {
                "protocol": evolve.PROTOCOL,
                "steps": terms.steps,
                "commits": sum(c.outcome == "committed" for c in log.closed),
                "final": log.head,
                **in_situ_json(scored),
            }
            _close(svc, run_id, summary)
        return scored

    # ------------------------------------------------------------------ reading

    def status(self, run_id: str) -> dict[str, Any]:
        """What the evolver may know of its run: the terms, where the run stands, and the
        case ids of the batches already scored (never a batch to come)."""
        state = self.service.states.current(run_id)
        terms = evolve_terms(state.opened)
        log = self.fold(run_id, state.next_seq)
        seen = terms.stream[: log.step * terms.batch]
        return {
            "run_id": run_id,
            "protocol": evolve.PROTOCOL,
            "task_id": state.opened.task_id,
            "state": "closed" if state.closed else "open",
            "steps": terms.steps,
            "batch": terms.batch,
            "scope": terms.scope,
            "step_tokens": terms.step_tokens,
            "step": log.step,
            "phase": log.phase,
            "head": log.head,
            "seed": state.seed_commit,
            "evolver_tokens_in_step": log.tokens if log.phase == "evolve" else 0,
            "scored_cases": seen,
            "immutable_paths": state.opened.terms.immutable_paths,
            "in_situ": None if log.in_situ is None else in_situ_json(log.in_situ),
        }

    def ensure_none(self, task_ref: str, terms: EvolveTerms, *, backend: str) -> NoneRun:
        """The stream's pinned NONE run (server/evolve_none.py)."""
        from holedger.server.evolve_none import ensure_none

        return ensure_none(self, task_ref, terms, backend=backend)


def _payload(rec: Record) -> Model | None:
    if rec.type not in FOLDED:
        return None
    return payload_model(rec.type).model_validate(rec.payload)


def _step_closed(
    log: evolve.EvolveLog, outcome: Literal["committed", "unchanged"], candidate: str
) -> StepClosed:
    assert log.request_id is not None and log.projection is not None
    return StepClosed(
        step=log.step,
        outcome=outcome,
        parent=log.head,
        candidate=candidate,
        request_id=log.request_id,
        projection_digest=log.projection,
        evolver_tokens=log.tokens,
    )


def _close(svc: ServerCore, run_id: str, summary: dict[str, Any]) -> None:
    from holedger.errors import LedgerConflictError

    for _ in range(200):
        try:
            svc.ledger.close_run(run_id, "completed", summary)
            return
        except LedgerConflictError:
            continue


def _overlap(folder: str, path: str) -> bool:
    fixed = path if path.endswith("/") else path + "/"
    return folder.startswith(fixed) or fixed.startswith(folder)


def _hint(refusal: Refusal) -> str:
    return {
        "evolve.out_of_turn": "GET /v1/runs/RUN/steps says which step awaits what",
        "evolve.done": "every step has run: the run is scored and closed",
        "evolve.out_of_scope": "change only files under the editable scope",
        "evolve.wrong_parent": "commit on the harness that scored the step (its candidate)",
        "evolve.step_budget": "close the step as 'unchanged'",
    }.get(refusal.code, "see GET /v1/runs/RUN/steps")


__all__ = ["ClosedStep", "Evidence", "EvolveRuns", "StepRefused"]
