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
* its scores are one per case and attempt, exactly, and hash to ``scores_digest``;
* no DisclosureProjected and no OptimizerRead of this run names its control run, its
  request or its trials (the control run's trials are shown to no optimizer);
* where its control run is at hand (``CheckInputs.runs``: the same ledger, or an audits
  bundle), it is that run's word: the control run's RunOpened names exactly this audit and
  run in its signed field ``control_of`` (a control run opened before that field: in its
  optimizer label ``hda-control audit=<id> run=<id>``, and the detail says how many were
  named by the label only) and is signed by this run's server key, its first
  ``control_size`` records hash to ``control_root``, they hold the request (same commit,
  split, cases and attempts, accepted), and the TrialCompleted events of that request are
  exactly the stated scores (trial id, case, attempt, score). Where it is not at hand (a
  run bundle alone), the check says how many it could not cross-check.

The control run's own replay holds it to the other side (``control_run``, in
:mod:`holedger.replay.checks.control_run`).
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.records import Record
from holedger.protocol.runs import control_label, control_scores_digest
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.events import (
    AuditControlEvaluated,
    CandidateCommitted,
    DisclosureProjected,
    EvaluationRequested,
    Model,
    OptimizerRead,
    RunClosed,
)

CHECK = "audit_controls"
ETYPE = "AuditControlEvaluated"


class AuditControlsFold:
    name = CHECK

    def __init__(self, ctx: Any) -> None:
        self.run_id = ctx.run_id
        self.seed = str(ctx.opened.terms.seed_commit)
        self.server_key = ctx.opened.keys["server"].model_dump(mode="json")
        self.runs = getattr(ctx.inputs, "runs", None)
        self.control_runs: dict[str, list[Record] | None] = {}
        self.crossed = 0  # control evaluations checked against their control run
        self.by_label: set[str] = set()  # control runs named by their label only (older)
        # every string a projection or read of the run held: where it was first shown
        self.shown: dict[str, tuple[int, str]] = {}
        self.controls: list[AuditControlEvaluated] = []
        self.not_here: set[str] = set()  # control runs not at hand
        self.closed = False
        self.requests: set[str] = set()
        self.committed: set[str] = set()
        self.failures: list[tuple[int, str, str]] = []
        self.audits: dict[str, int] = {}
        self.trials = 0

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, EvaluationRequested):
            self.requests.add(payload.request_id)
        elif isinstance(payload, CandidateCommitted):
            self.committed.add(payload.candidate)
        elif isinstance(payload, RunClosed):
            self.closed = True
        elif isinstance(payload, DisclosureProjected | OptimizerRead):
            for text in _strings(rec.payload):
                self.shown.setdefault(text, (rec.seq, rec.type))
        elif isinstance(payload, AuditControlEvaluated):
            self.controls.append(payload)
            self.audits[payload.audit_id] = self.audits.get(payload.audit_id, 0) + 1
            self.trials += len(payload.scores)
            for reason in self._problems(rec, payload) + self._cross_check(payload):
                self.failures.append((rec.seq, ETYPE, reason))

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

    def _records(self, run_id: str) -> list[Record] | None:
        if run_id not in self.control_runs:
            self.control_runs[run_id] = None if self.runs is None else self.runs.run_records(run_id)
        return self.control_runs[run_id]

    def _cross_check(self, control: AuditControlEvaluated) -> list[str]:
        """What the control run says against what the server stated in this run."""
        cid = control.control_run_id
        what = f"control evaluation {control.request_id} of audit {control.audit_id}"
        if cid == self.run_id:  # failed above: it ran in this run
            return []
        records = self._records(cid)
        if records is None:
            self.not_here.add(cid)
            return []
        self.crossed += 1
        first = records[0].payload if records and records[0].type == "RunOpened" else {}
        problems = []
        named = first.get("control_of")
        if named is None:  # opened before the field: its label names the audit and run
            self.by_label.add(cid)
            if first.get("optimizer") != control_label(control.audit_id, self.run_id):
                problems.append(
                    f"{what}: control run {cid}'s RunOpened does not name this audit and run "
                    "(no control_of; its optimizer label names another)"
                )
        elif named != {"audit_id": control.audit_id, "run_id": self.run_id}:
            problems.append(
                f"{what}: control run {cid}'s RunOpened does not name this audit and run "
                f"(its control_of names audit {named.get('audit_id')} of run "
                f"{named.get('run_id')})"
            )
        if (first.get("keys") or {}).get("server") != self.server_key:
            problems.append(f"{what}: control run {cid} is not signed by this run's server key")
        head = records[: control.control_size]
        frontier = MerkleFrontier()
        for rec in head:
            frontier.append(rec.leaf_hash)
        if len(head) != control.control_size or frontier.root().hex() != control.control_root:
            problems.append(
                f"{what}: control run {cid} has no tree of size {control.control_size} with "
                "the stated root"
            )
        asked = next(
            (
                r.payload
                for r in head
                if r.type == "EvaluationRequested"
                and r.payload.get("request_id") == control.request_id
            ),
            None,
        )
        if asked is None or [
            asked.get("candidate"),
            asked.get("split"),
            asked.get("case_ids"),
            asked.get("attempts"),
            asked.get("decision"),
        ] != [control.candidate, control.split, control.case_ids, control.attempts, "accepted"]:
            problems.append(
                f"{what}: control run {cid} holds no such accepted request of "
                f"{control.candidate[:12]} on these cases and attempts"
            )
        ran = sorted(
            (str(p["trial_id"]), str(p["case_id"]), int(p["attempt"]), Fraction(str(p["score"])))
            for p in (r.payload for r in head if r.type == "TrialCompleted")
            if p.get("request_id") == control.request_id
            and (p.get("candidate"), p.get("split")) == (control.candidate, control.split)
        )
        stated = sorted((s.trial_id, s.case_id, s.attempt, s.score) for s in control.scores)
        if ran != stated:
            problems.append(
                f"{what}: its scores are not the TrialCompleted events of request "
                f"{control.request_id} in control run {cid}"
            )
        return problems

    def _disclosed(self) -> None:
        """Fail the projection or read of this run that first showed a control run, one of
        its control requests or trials (each string's first): those are shown to no
        optimizer."""
        for control in self.controls:
            trials = {s.trial_id for s in control.scores}
            ids = (control.control_run_id, control.request_id)
            where = sorted(
                {
                    at
                    for text, at in self.shown.items()
                    if text in trials or any(i in text for i in ids)
                }
            )
            for seq, etype in where:
                self.failures.append(
                    (
                        seq,
                        etype,
                        f"{etype} names control run {control.control_run_id} or its "
                        f"request {control.request_id} of audit {control.audit_id}: "
                        "a control trial was shown to the optimizer",
                    )
                )

    def finish(self, out: ReportBuilder) -> None:
        out.declare(CHECK, "audit control evaluations: after RunClosed, no optimizer's")
        self._disclosed()
        for seq, etype, reason in self.failures:
            out.fail(seq, etype, reason, check=CHECK)
        evaluations = sum(self.audits.values())
        out.section(
            CHECK,
            {
                "evaluations": evaluations,
                "trials": self.trials,
                "audits": sorted(self.audits),
                "cross_checked": self.crossed,
                "control_runs_not_at_hand": sorted(self.not_here),
                "control_runs_named_by_label": sorted(self.by_label),
            },
        )
        if not self.failures:
            crossed = f"; {self.crossed} cross-checked against their control runs" + (
                f", {evaluations - self.crossed} not (control run not at hand)"
                if self.crossed < evaluations
                else ""
            )
            if self.by_label:
                crossed += (
                    f"; {counted(len(self.by_label), 'control run')} opened before control_of,"
                    " named by its optimizer label only"
                )
            out.check(
                CHECK,
                True,
                f"{counted(evaluations, 'control evaluation')} for "
                f"{counted(len(self.audits), 'audit')}, all after RunClosed, outside the "
                f"budget, shown to no optimizer{crossed}"
                if evaluations
                else "no audit's control evaluation recorded",
            )


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value (keys and values)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
