"""The safety section: every recorded SafetyViolation and every unisolated trial.

A trial recorded without running (its sandbox failed to start, the evaluation was
interrupted before it, or its server stopped before recording it) carries
``isolation: "none"`` but ran nothing outside a sandbox: it has no exit status, no wall
time, no output, no answer, no model call and score 0. Such trials are counted as not
run, not as unisolated.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from holedger.ledger.records import Record
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.events import Model, SafetyViolation, TrialCompleted

MAX_LISTED = 200


class SafetyFold:
    name = "safety"

    def __init__(self, ctx: CheckContext) -> None:
        self.by_category: Counter[str] = Counter()
        self.listed: list[dict[str, Any]] = []
        self.unisolated = 0
        self.not_run = 0
        self.trials = 0

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, SafetyViolation):
            self.by_category[payload.category] += 1
            if len(self.listed) < MAX_LISTED:
                self.listed.append(
                    {
                        "seq": rec.seq,
                        "category": payload.category,
                        "trial_id": payload.trial_id,
                        "call_id": payload.call_id,
                        "detail": payload.detail,
                    }
                )
        elif isinstance(payload, TrialCompleted):
            self.trials += 1
            if payload.isolation == "none":
                if _ran(payload):
                    self.unisolated += 1
                else:
                    self.not_run += 1

    def finish(self, out: ReportBuilder) -> None:
        out.section(
            "safety",
            {
                "violations": sum(self.by_category.values()),
                "by_category": dict(sorted(self.by_category.items())),
                "listed": self.listed,
                "trials": self.trials,
                "unisolated_trials": self.unisolated,
                "not_run_trials": self.not_run,
            },
        )
        ran = self.trials - self.not_run
        note = f"; {counted(self.not_run, 'trial')} recorded as not run" if self.not_run else ""
        if self.unisolated:
            out.warn(
                "isolation",
                False,
                f"{self.unisolated} of {counted(ran, 'trial')} that ran did so without "
                f"isolation (process backend){note}",
            )
        elif ran:
            out.warn(
                "isolation",
                True,
                f"all {counted(ran, 'trial')} that ran did so in an isolating sandbox{note}",
            )
        else:  # named all the same: a log broken before its first trial still shows it
            out.warn("isolation", True, f"no trial ran, so none ran without isolation{note}")


def _ran(trial: TrialCompleted) -> bool:
    """Whether the trial's harness ran at all (see the module's docstring)."""
    return not (
        trial.exit_status is None
        and trial.wall_ms == 0
        and not trial.timed_out
        and not trial.oom
        and trial.answer_digest is None
        and trial.output_digest is None
        and trial.trace_digest is None
        and trial.gateway_calls == 0
        and trial.score == 0
    )
