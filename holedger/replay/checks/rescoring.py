"""A re-scoring run (``holedger rescore``) is the trusted server scoring a closed run's
nominee again on the test split, outside that run's budget: a run of its own, bound to
the run it re-scores by ``RunOpened.rescore_of`` (that run's id, its nominee's commit and
git tree, which re-scoring this is). Every check of a run applies to it as it is (its
held-out trials, its RunScored, its pinned E(H0)); this one (``rescoring``) holds it to
what a re-scoring may be:

* its optimizer label is ``rescore`` (and a run with that label has ``rescore_of``);
* it searched nothing: no dev or val request;
* the candidate it nominated has the git tree ``rescore_of`` names: the same files as
  the nominee it re-scores (the commit may differ; the tree is the harness).

That the named run's nominee has that tree is the other run's fact: whoever pairs the two
(``holedger analysis bands``) checks it from both runs' verified logs, and leaves out a
re-scoring whose tree or task is not its run's. Runs that are not re-scorings have no such
check.
"""

from __future__ import annotations

from holedger.ledger.records import Record
from holedger.protocol.rules import RESCORE_OPTIMIZER
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    EvaluationRequested,
    Model,
)

CHECK = "rescoring"


class RescoringFold:
    name = "rescoring"

    def __init__(self, ctx: CheckContext) -> None:
        self.of = ctx.opened.rescore_of
        self.applies = self.of is not None or ctx.opened.optimizer == RESCORE_OPTIMIZER
        self.label = ctx.opened.optimizer
        self.trees: dict[str, str] = {}
        self.nominated: tuple[int, str] | None = None
        self.failures: list[tuple[int | None, str | None, str]] = []

    def apply(self, rec: Record, payload: Model) -> None:
        if not self.applies:
            return
        if isinstance(payload, CandidateCommitted):
            self.trees.setdefault(payload.candidate, payload.tree)
        elif isinstance(payload, EvaluationRequested) and payload.split != "test":
            self.failures.append(
                (rec.seq, "EvaluationRequested", f"a re-scoring run asked for {payload.split}")
            )
        elif isinstance(payload, CandidateNominated) and self.nominated is None:
            self.nominated = (rec.seq, payload.candidate)
            if self.of is not None and self.trees.get(payload.candidate) != self.of.tree:
                self.failures.append(
                    (
                        rec.seq,
                        "CandidateNominated",
                        f"the re-scored candidate {payload.candidate[:12]} has tree "
                        f"{(self.trees.get(payload.candidate) or 'none')[:12]}, not the tree "
                        f"{self.of.tree[:12]} of run {self.of.run_id}'s nominee",
                    )
                )

    def finish(self, out: ReportBuilder) -> None:
        if not self.applies:
            return
        out.declare(CHECK, "a re-scoring run scores the named nominee's tree and nothing else")
        if self.of is None:
            self.failures.append((0, "RunOpened", "a rescore run that names no run it re-scores"))
        elif self.label != RESCORE_OPTIMIZER:
            self.failures.append(
                (0, "RunOpened", f"a re-scoring run labelled {self.label!r}, not 'rescore'")
            )
        for seq, etype, reason in self.failures:
            out.fail(seq, etype, reason, check=CHECK)
        if self.failures or self.of is None:
            return
        out.section(
            "rescoring",
            {
                "run_id": self.of.run_id,
                "candidate": self.of.candidate,
                "tree": self.of.tree,
                "index": self.of.index,
            },
        )
        if self.nominated is None:
            out.check(CHECK, True, f"re-scoring {self.of.index} of run {self.of.run_id}: not yet")
        else:
            out.check(
                CHECK,
                True,
                f"re-scoring {self.of.index} of run {self.of.run_id}: its nominee's tree "
                f"{self.of.tree[:12]}, scored on the test split with no search",
            )
