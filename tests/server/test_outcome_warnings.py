"""eval's warnings: each trial without an answer counted once, under its cause."""

from __future__ import annotations

from typing import Any

from gateway.helpers import completed_trial

from holedger.schemas.events import SafetyViolation, TokenUsage
from holedger.server.trials import TrialOutcome, outcome_warnings


def _outcome(
    answer: Any = None,
    *,
    exit_status: int | None = 0,
    violation: str | None = None,
    failed: dict[str, int] | None = None,
    calls: int = 0,
    **flags: bool,
) -> TrialOutcome:
    completed = completed_trial("t", TokenUsage(), calls).model_copy(
        update={
            "exit_status": exit_status,
            "timed_out": flags.get("timed_out", False),
            "oom": flags.get("oom", False),
        }
    )
    violations = [SafetyViolation(category=violation, detail="x")] if violation else []
    return TrialOutcome(completed, violations, answer, failed or {})


def test_nothing_wrong_says_nothing() -> None:
    assert outcome_warnings([_outcome({"a": 1}, calls=2), _outcome(0)]) == []


def test_each_trial_without_an_answer_is_counted_once_under_its_cause() -> None:
    outcomes = [
        _outcome(exit_status=None, timed_out=True),  # killed: no exit status of its own
        _outcome(exit_status=137, oom=True),
        _outcome(exit_status=None, violation="sandbox_error"),
        _outcome(exit_status=3),
        _outcome(exit_status=3),
        _outcome({"a": 1}, timed_out=True),  # answered, then ran past the limit
        _outcome({"a": 1}),
    ]
    assert outcome_warnings(outcomes) == [
        "5 of 7 trials gave no answer: exit status 3 (2); timed out (1); out of memory (1); "
        "could not run (sandbox_error) (1)",
        "1 of 7 trials answered but were cut short: timed out (1)",
    ]


def test_failed_model_calls_are_counted_by_code_and_an_unreachable_upstream_is_named() -> None:
    outcomes = [
        _outcome({"a": 1}, calls=3, failed={"budget_exceeded": 1}),
        _outcome({"a": 1}, calls=2, failed={"budget_exceeded": 1, "status 429": 1}),
    ]
    assert outcome_warnings(outcomes) == [
        "3 of 5 model calls failed: budget_exceeded (2); status 429 (1)"
    ]
    down = [
        _outcome(
            exit_status=1, calls=2, failed={"upstream unreachable: ConnectError, status 502": 2}
        )
    ]
    lines = outcome_warnings(down)
    assert (
        lines[1] == "2 of 2 model calls failed: upstream unreachable: ConnectError, status 502 (2)"
    )
    assert "could not reach its upstream" in lines[2]
