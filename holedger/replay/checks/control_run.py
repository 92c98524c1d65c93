"""An audit's control run, from its own side (docs/AUDITS.md, "Control evaluations").

The trusted server opens a control run for an audit of a closed run with the signed field
``RunOpened.control_of`` naming the audit and the audited run. Every check of a run
applies to it as it is; this one (``control_run``) holds the binding to the audited run:

* the run it names is another run (a run is never its own control run);
* where the audited run is at hand (``CheckInputs.runs``: the same ledger, or an audits
  bundle), it records at least one AuditControlEvaluated naming this run as its control
  run, and each of those is of the audit ``control_of`` names. A run that carries
  ``control_of`` while no audit of the named run refers to it is flagged: it would pass
  for a control run it is not, and so is one naming a run its ledger does not hold.
  Where the audited run is not at hand (a bundle of the control run alone), the check
  says so.

The audited run's ``audit_controls`` check holds the other side: each of its
AuditControlEvaluated events names a control run whose ``control_of`` names exactly that
audit and run. Runs without ``control_of`` have no such check.
"""

from __future__ import annotations

from typing import Any

from holedger.ledger.records import Record
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.events import Model

CHECK = "control_run"


class ControlRunFold:
    name = CHECK

    def __init__(self, ctx: Any) -> None:
        self.run_id: str = ctx.run_id
        self.of = ctx.opened.control_of
        self.runs = getattr(ctx.inputs, "runs", None)

    def apply(self, rec: Record, payload: Model) -> None:
        return None  # the binding is judged from RunOpened and the audited run

    def finish(self, out: ReportBuilder) -> None:
        if self.of is None:
            return
        of = self.of
        out.declare(CHECK, "a control run is referenced by the audit and run it names")
        what = f"control run of audit {of.audit_id} of run {of.run_id}"
        section: dict[str, Any] = {"audit_id": of.audit_id, "run_id": of.run_id}
        if of.run_id == self.run_id:
            out.fail(0, "RunOpened", f"a {what}: it names itself", check=CHECK)
            return
        records = None if self.runs is None else self.runs.run_records(of.run_id)
        if records is None and getattr(self.runs, "complete", False):
            out.fail(0, "RunOpened", f"a {what}: that run is not in this ledger", check=CHECK)
            return
        if records is None:
            section["audited_run_at_hand"] = False
            out.section(CHECK, section)
            out.check(
                CHECK,
                True,
                f"{what}: that run is not at hand, its reference to this run not checked",
            )
            return
        naming = [
            r.payload
            for r in records
            if r.type == "AuditControlEvaluated" and r.payload.get("control_run_id") == self.run_id
        ]
        others = sorted({str(p.get("audit_id")) for p in naming} - {of.audit_id})
        section.update(audited_run_at_hand=True, evaluations=len(naming))
        out.section(CHECK, section)
        if not naming:
            out.fail(
                0,
                "RunOpened",
                f"a {what}, but no AuditControlEvaluated of run {of.run_id} names this run: "
                "no audit refers to it",
                check=CHECK,
            )
        elif others:
            out.fail(
                0,
                "RunOpened",
                f"a {what}, but run {of.run_id} names this run for audit {', '.join(others)}",
                check=CHECK,
            )
        else:
            out.check(
                CHECK,
                True,
                f"{what}: {counted(len(naming), 'control evaluation')} of that run name it",
            )
