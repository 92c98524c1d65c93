"""Control evaluations: the trusted server evaluates named commits on named search cases
with named attempts for an audit of a closed run, with the same trial machinery as any
trial (sandbox, gateway, verifier), outside the audited optimizer's budget and shown to
no optimizer (docs/AUDITS.md, "Control evaluations").

The trials run in a control run of their own in the same ledger: a closed run takes no
trial and no model call (its tokens died at its close, and the gateway refuses its calls),
so the control run is where they get live tokens. It is a run of the audited task whose
RunOpened names the audit and the audited run in the signed field ``control_of`` (and in
its optimizer label, ``hda-control audit=<id> run=<id>``), opened by the server with a
search budget wide enough for the audit's requests, its candidates committed with the
audited run's parent chain so their commit ids are the same, closed when the audit's step
is done, and verified by replay as any run (check ``control_run`` holds its binding).

Then the server records, in the **audited run's own stream after its RunClosed**, one
AuditControlEvaluated per request (:func:`record`): the audit, the harness, the commit,
the cases, the attempts, the control run's request and tree head, every trial's score and
their digest; the ledger takes nothing else after RunClosed, and replay's
``audit_controls`` check holds these to that form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from holedger.config import Settings
from holedger.errors import NotFoundError, PolicyError, UsageError
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.records import Record
from holedger.ledger.store import Ledger
from holedger.protocol.runs import control_label as control_label
from holedger.protocol.runs import control_scores_digest
from holedger.schemas.events import (
    AuditControlEvaluated,
    BudgetVector,
    ControlOf,
    ControlScore,
    SplitBudget,
)
from holedger.server.candidates import CandidateRepo
from holedger.server.service import RunService, ServerConfig
from holedger.server.taskview import ServerTask

WIDE = 10**12
ControlHarness = Literal["H0", "H0scale", "Hneutral", "Hval"]


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
        auditor_key_id: str,
        run_id: str,
        backend: str | None,
        gateway: Any = "auto",
        baseline: bool = False,
    ) -> None:
        if not ledger.is_closed(run_id):
            raise UsageError(
                f"run {run_id} is open: control evaluations are made for an audit of a closed run",
                hint="audit the run once it is closed",
            )
        server = ledger.run_terms(run_id).keys["server"].key_id
        if ledger.signers["server"].key_id_hex != server:
            raise UsageError(
                f"this ledger is not opened with the server key of run {run_id} ({server})",
                hint="run control evaluations in the home of the server that ran the run",
            )
        wide = widened(task)
        self.ledger = ledger
        self.audit_id = audit_id
        self.auditor_key_id = auditor_key_id
        self.audited = run_id
        self.service = RunService(
            settings,
            ledger,
            ServerConfig(gateway=gateway, task_loader=lambda ref: wide, default_backend=backend),
        )
        opened = self.service.open_run(
            task.ref,
            optimizer=control_label(audit_id, run_id),
            backend=backend,
            baseline=baseline,
            control_of=ControlOf(audit_id=audit_id, run_id=run_id),
        )
        self.run_id = opened.run_id
        self.settings = settings

    def commit_chain(
        self, audited_repo: Path, parents: Mapping[str, str | None], seed: str, commit: str
    ) -> str:
        """Commit ``commit`` of the audited run with its parent chain (oldest first), so
        the control run holds it under the same commit id."""
        chain: list[str] = []
        cursor: str | None = commit
        while cursor is not None and cursor != seed:
            if cursor not in parents:
                raise NotFoundError(f"commit {cursor[:12]} is not a candidate of the run")
            chain.append(cursor)
            cursor = parents[cursor]
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

    def score(self, harness: ControlHarness, candidate: str) -> AuditControlEvaluated:
        """Nominate ``candidate`` in the control run (opened with ``baseline``): the server
        scores it on every test case K times and closes the control run; its record."""
        scored = self.service.nominate(self.run_id, candidate)
        records = list(self.ledger.records(self.run_id))
        request = next(
            r.payload
            for r in records
            if r.type == "EvaluationRequested" and r.payload["split"] == "test"
        )
        return self._statement(
            harness, scored.candidate, "test", request, records, list(request["case_ids"])
        )

    def evaluate(
        self,
        harness: ControlHarness,
        candidate: str,
        split: Literal["dev", "val"],
        case_ids: Sequence[str],
        attempts: int,
    ) -> AuditControlEvaluated:
        """Run the request in the control run; the server's record of it."""
        evaluation = self.service.evaluate(self.run_id, candidate, split, case_ids, attempts)
        records = list(self.ledger.records(self.run_id))
        request = {"request_id": evaluation.request_id, "attempts": attempts}
        return self._statement(harness, evaluation.candidate, split, request, records, case_ids)

    def _statement(
        self,
        harness: ControlHarness,
        candidate: str,
        split: Literal["dev", "val", "test"],
        request: Mapping[str, Any],
        records: Sequence[Record],
        case_ids: Sequence[str],
    ) -> AuditControlEvaluated:
        frontier = MerkleFrontier()
        for rec in records:
            frontier.append(rec.leaf_hash)
        scores = [
            ControlScore(
                trial_id=str(r.payload["trial_id"]),
                case_id=str(r.payload["case_id"]),
                attempt=int(r.payload["attempt"]),
                score=Fraction(str(r.payload["score"])),
            )
            for r in records
            if r.type == "TrialCompleted" and r.payload["request_id"] == request["request_id"]
        ]
        return AuditControlEvaluated(
            audit_id=self.audit_id,
            auditor_key_id=self.auditor_key_id,
            harness=harness,
            candidate=candidate,
            split=split,
            case_ids=list(case_ids),
            attempts=int(request["attempts"]),
            control_run_id=self.run_id,
            control_size=frontier.size,
            control_root=frontier.root().hex(),
            request_id=str(request["request_id"]),
            scores=scores,
            scores_digest=control_scores_digest((s.case_id, s.attempt, s.score) for s in scores),
        )

    def close(self) -> None:
        try:
            if not self.ledger.is_closed(self.run_id):  # (a scoring closed it already)
                self.ledger.close_run(self.run_id, reason="audit-control")
        finally:
            self.service.close()


def record(ledger: Ledger, run_id: str, controls: Sequence[AuditControlEvaluated]) -> list[Record]:
    """Append the server's record of ``controls`` to the closed audited run (then a
    Checkpoint); their records, in order."""
    if not controls:
        return []
    written = ledger.append_many(run_id, [("AuditControlEvaluated", c, "server") for c in controls])
    return [r for r in written if r.type == "AuditControlEvaluated"]
