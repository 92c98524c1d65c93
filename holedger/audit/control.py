"""Control evaluations: the trusted server evaluates named commits on named search cases
with named attempts for an audit, with the same trial machinery as any trial (sandbox,
gateway, verifier), outside the audited optimizer's budget and shown to no optimizer.

They run in a control run of their own in the same ledger: a run of the audited task
whose optimizer label names the audit and the audited run (``hda-control audit=<id>
run=<id>``), opened by the server with a search budget wide enough for the audit's
requests (the budget of the audited run is not touched), its candidates committed with
the audited run's parent chain so their commit ids are the same, and closed when the
audit's step is done. Its events are a run's events, signed by the server and gateway
keys; replay verifies it as any run. The audit records, signed by the server key, which
request of which control run evaluated which harness (:class:`ControlEvaluated`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from holedger.audit.events import CheckpointRef, ControlEvaluated, Harness
from holedger.audit.facts import RunFacts, Trial, read_run, scores_digest
from holedger.config import Settings
from holedger.errors import NotFoundError, PolicyError
from holedger.ledger.store import Ledger
from holedger.schemas.events import BudgetVector, SplitBudget
from holedger.server.candidates import CandidateRepo
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

WIDE = 10**12


def control_label(audit_id: str, run_id: str) -> str:
    return f"hda-control audit={audit_id} run={run_id}"


def widened(task: ServerTask) -> ServerTask:
    """The task with a search budget no audit request can exceed (same digest: the
    budget of a control run is its own, recorded in its RunOpened)."""
    budget = BudgetVector(
        dev=SplitBudget(calls=WIDE, case_passes=Fraction(WIDE)),
        val=SplitBudget(calls=WIDE, case_passes=Fraction(WIDE)),
        target_tokens=WIDE,
        per_trial_tokens=task.terms.budget.per_trial_tokens,
    )
    return dataclasses.replace(task, terms=task.terms.model_copy(update={"budget": budget}))


class ControlRun:
    """One control run of an audit: open, commit, evaluate, close."""

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        task: ServerTask,
        *,
        audit_id: str,
        run_id: str,
        backend: str | None,
        gateway: Any = "auto",
    ) -> None:
        wide = widened(task)
        self.ledger = ledger
        self.audit_id = audit_id
        self.audited = run_id
        self.service = RunService(
            settings,
            ledger,
            gateway=gateway,
            task_loader=lambda ref: wide,
            default_backend=backend,
        )
        opened = self.service.open_run(
            task.ref, optimizer=control_label(audit_id, run_id), backend=backend, baseline=False
        )
        self.run_id = opened.run_id
        self.settings = settings

    def commit_chain(self, audited_repo: Path, facts: RunFacts, commit: str) -> str:
        """Commit ``commit`` of the audited run with its parent chain (oldest first), so
        the control run holds it under the same commit id."""
        chain: list[str] = []
        cursor: str | None = commit
        while cursor is not None and cursor != facts.seed_commit:
            if cursor not in facts.parents:
                raise NotFoundError(f"commit {cursor[:12]} is not a candidate of the run")
            chain.append(cursor)
            cursor = facts.parents[cursor]
        repo = CandidateRepo(audited_repo)
        parent: str | None = None
        for step in reversed(chain):
            files = repo.files(step)
            got = self.service.commit_candidate(self.run_id, files, parent=parent)
            if got.candidate != step:
                raise PolicyError(
                    f"commit {step[:12]} does not rebuild in the control run ({got.candidate[:12]})"
                )
            parent = step
        return commit

    def commit_files(self, source: Path, parent: str) -> Any:
        return self.service.commit_candidate(self.run_id, source, parent=parent)

    def evaluate(
        self,
        harness: Harness,
        candidate: str,
        split: str,
        case_ids: Sequence[str],
        attempts: int,
    ) -> tuple[ControlEvaluated, list[Trial]]:
        """Run the request; the server's statement of it and its trials."""
        evaluation = self.service.evaluate(self.run_id, candidate, split, case_ids, attempts)
        facts = read_run(self.run_id, self.ledger.records(self.run_id))
        trials = [t for t in facts.trials if t.request_id == evaluation.request_id]
        size = len(facts.leaves)
        statement = ControlEvaluated(
            audit_id=self.audit_id,
            harness=harness,
            candidate=evaluation.candidate,
            control_run_id=self.run_id,
            control_checkpoint=CheckpointRef(size=size, root=facts.root_at(size) or "0" * 64),
            request_id=evaluation.request_id,
            split=split,
            case_ids=list(case_ids),
            attempts=attempts,
            scores_digest=scores_digest(trials),
        )
        return statement, trials

    def close(self) -> None:
        try:
            self.ledger.close_run(self.run_id, reason="audit-control")
        finally:
            self.service.close()
