"""What an audit step asks of the trusted server (holedger.server.controls): control
evaluations in a control run, then the server's record of each in the audited run's
stream after its RunClosed, and the audit's own server-signed ControlEvaluated naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

from holedger.audit.events import CheckpointRef, ControlEvaluated
from holedger.audit.facts import Trial, read_run
from holedger.ledger.store import Ledger
from holedger.schemas.events import AuditControlEvaluated
from holedger.server import controls
from holedger.server.controls import ControlHarness, ControlRun

Split = Literal["dev", "val"]


class Controls:
    """The control evaluations of one audit step: made on demand, recorded at the end."""

    def __init__(self, ledger: Ledger, run_id: str, opener: Callable[[], ControlRun]) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.opener = opener
        self.control: ControlRun | None = None
        self.made: list[AuditControlEvaluated] = []

    def run(self) -> ControlRun:
        if self.control is None:
            self.control = self.opener()
        return self.control

    def evaluate(
        self, harness: ControlHarness, candidate: str, cases: dict[str, list[str]], attempts: int
    ) -> list[Trial]:
        """Evaluate ``candidate`` on ``cases`` (by split) with ``attempts``; its trials."""
        control = self.run()
        trials: list[Trial] = []
        for split, ids in cases.items():
            made = control.evaluate(harness, candidate, cast(Split, split), ids, attempts)
            self.made.append(made)
            facts = read_run(control.run_id, self.ledger.records(control.run_id))
            trials += [t for t in facts.trials if t.request_id == made.request_id]
        return trials

    def scored(self, scorer: ControlRun, harness: ControlHarness, candidate: str) -> list[Trial]:
        """Score ``candidate`` on the held-out split in ``scorer`` (a control run of its
        own, which the scoring closes); its trials."""
        made = scorer.score(harness, candidate)
        self.made.append(made)
        facts = read_run(scorer.run_id, self.ledger.records(scorer.run_id))
        return [t for t in facts.trials if t.request_id == made.request_id]

    def close(self) -> None:
        """Close the control run (once): its trials are all recorded before the audited
        run records them."""
        control, self.control = self.control, None
        if control is not None:
            control.close()

    def record(self) -> list[tuple[str, Any, Literal["server"]]]:
        """Record the control evaluations in the audited run (server-signed, after its
        RunClosed), and the audit's ControlEvaluated items naming them."""
        self.close()
        written = controls.record(self.ledger, self.run_id, self.made)
        return [
            (
                "ControlEvaluated",
                statement(AuditControlEvaluated.model_validate(r.payload), r.seq),
                "server",
            )
            for r in written
        ]


def statement(made: AuditControlEvaluated, run_seq: int) -> ControlEvaluated:
    """The audit's ControlEvaluated for the run's AuditControlEvaluated at ``run_seq``."""
    return ControlEvaluated(
        audit_id=made.audit_id,
        harness=made.harness,
        candidate=made.candidate,
        control_run_id=made.control_run_id,
        control_checkpoint=CheckpointRef(size=made.control_size, root=made.control_root),
        request_id=made.request_id,
        split=made.split,
        case_ids=list(made.case_ids),
        attempts=made.attempts,
        scores_digest=made.scores_digest,
        run_seq=run_seq,
    )


def control_trials(
    ledger: Ledger, statements: Sequence[ControlEvaluated], harness: str
) -> list[Trial]:
    """The trials of an audit's recorded control evaluations of ``harness``, read from
    their control runs."""
    out: list[Trial] = []
    for c in statements:
        if c.harness == harness and ledger.has_run(c.control_run_id):
            facts = read_run(c.control_run_id, ledger.records(c.control_run_id))
            out += [t for t in facts.trials if t.request_id == c.request_id]
    return out
