"""The safety section: every recorded SafetyViolation and every unisolated trial."""

from __future__ import annotations

from collections import Counter
from typing import Any

from holedger.ledger.records import Record
from holedger.replay.report import ReportBuilder
from holedger.schemas.events import Model, SafetyViolation, TrialCompleted

MAX_LISTED = 200


class SafetyProjection:
    name = "safety"

    def __init__(self, ctx: Any) -> None:
        self.by_category: Counter[str] = Counter()
        self.listed: list[dict[str, Any]] = []
        self.unisolated = 0
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
                self.unisolated += 1

    def finish(self, out: ReportBuilder) -> None:
        out.section(
            "safety",
            {
                "violations": sum(self.by_category.values()),
                "by_category": dict(sorted(self.by_category.items())),
                "listed": self.listed,
                "trials": self.trials,
                "unisolated_trials": self.unisolated,
            },
        )
        if self.unisolated:
            out.warn(
                "isolation",
                False,
                f"{self.unisolated} of {self.trials} trials ran without isolation "
                "(process backend)",
            )
        elif self.trials:
            out.warn("isolation", True, f"all {self.trials} trials ran in an isolating sandbox")
        else:  # named all the same: a log broken before its first trial still shows it
            out.warn("isolation", True, "no trial recorded, so none ran without isolation")
