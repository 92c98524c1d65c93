"""An audit's control evaluations, as the audited run records them (docs/AUDITS.md).

After a run's RunClosed the server may append AuditControlEvaluated events (each batch
closed by a Checkpoint): its word that it evaluated a commit on named search cases with
named attempts for an audit, outside the optimizer's budget and shown to no optimizer.
The budget, disclosure and order checks never see them as the optimizer's: they are no
EvaluationRequested and no DisclosureProjected. This check holds them to that form:

* signed by the server, and only after RunClosed (one before it sits in the part of the
  log the optimizer's projections came from: it could have been shown);
* not a request of this run (a request of the run was projected to the optimizer), nor
  run in this run (its control run is another run);
* H0 and H0scale evaluate the run's seed commit; Hval (B5's val-selected candidate) is a
  candidate of the run, and is the only harness scored on the test split;
* its scores are one per case and attempt, exactly, and hash to ``scores_digest``.
"""

from __future__ import annotations

from typing import Any

from holedger.ledger.records import Record
from holedger.protocol.runs import control_scores_digest
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.events import (
    AuditControlEvaluated,
    CandidateCommitted,
    EvaluationRequested,
    Model,
    RunClosed,
)

CHECK = "audit_controls"
ETYPE = "AuditControlEvaluated"


class AuditControlsFold:
    name = CHECK

    def __init__(self, ctx: Any) -> None:
        self.run_id = ctx.run_id
        self.seed = str(ctx.opened.terms.seed_commit)
        self.closed = False
        self.requests: set[str] = set()
        self.committed: set[str] = set()
        self.failures: list[tuple[int, str]] = []
        self.audits: dict[str, int] = {}
        self.trials = 0

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, EvaluationRequested):
            self.requests.add(payload.request_id)
        elif isinstance(payload, CandidateCommitted):
            self.committed.add(payload.candidate)
        elif isinstance(payload, RunClosed):
            self.closed = True
        elif isinstance(payload, AuditControlEvaluated):
            self.audits[payload.audit_id] = self.audits.get(payload.audit_id, 0) + 1
            self.trials += len(payload.scores)
            for reason in self._problems(rec, payload):
                self.failures.append((rec.seq, reason))

    def _problems(self, rec: Record, control: AuditControlEvaluated) -> list[str]:
        what = f"control evaluation {control.request_id} of audit {control.audit_id}"
        problems = []
        if rec.role != "server":
            problems.append(f"{what} is signed by the {rec.role}, not the server")
        if not self.closed:
            problems.append(
                f"{what} is recorded before RunClosed: the run's optimizer could be shown it"
            )
        if control.request_id in self.requests:
            problems.append(
                f"{what} is a request of this run: its projection was shown to the optimizer"
            )
        if control.control_run_id == self.run_id:
            problems.append(f"{what} names this run as its control run: it ran in the run")
        if (control.split == "test") != (control.harness == "Hval"):
            problems.append(f"{what}: only Hval (B5) is scored on the test split, and on it")
        if control.harness == "Hval" and control.candidate not in self.committed:
            problems.append(f"{what}: Hval {control.candidate[:12]} is not a candidate of the run")
        if control.harness in ("H0", "H0scale") and control.candidate != self.seed:
            problems.append(
                f"{what} evaluates {control.candidate[:12]} as {control.harness}, "
                "not the run's seed commit"
            )
        pairs = sorted((s.case_id, s.attempt) for s in control.scores)
        wanted = sorted((c, a) for c in control.case_ids for a in range(control.attempts))
        if pairs != wanted:
            problems.append(f"{what}: its scores are not one per case and attempt")
        digest = control_scores_digest((s.case_id, s.attempt, s.score) for s in control.scores)
        if digest != control.scores_digest:
            problems.append(f"{what}: its scores do not hash to its scores_digest")
        return problems

    def finish(self, out: ReportBuilder) -> None:
        out.declare(CHECK, "audit control evaluations: after RunClosed, no optimizer's")
        for seq, reason in self.failures:
            out.fail(seq, ETYPE, reason, check=CHECK)
        evaluations = sum(self.audits.values())
        out.section(
            CHECK,
            {"evaluations": evaluations, "trials": self.trials, "audits": sorted(self.audits)},
        )
        if not self.failures:
            out.check(
                CHECK,
                True,
                f"{counted(evaluations, 'control evaluation')} for "
                f"{counted(len(self.audits), 'audit')}, all after RunClosed, outside the "
                "budget, shown to no optimizer"
                if evaluations
                else "no audit's control evaluation recorded",
            )
