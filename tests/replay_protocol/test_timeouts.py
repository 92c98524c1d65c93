"""The timeout rule of the terms, re-checked on every trial: under "zero" a timed-out
trial that scores anything else fails ``timeouts``; "verifier" lets its answer score;
terms written before the rule are not judged on it, and say so."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from holedger.ledger.store import Ledger
from holedger.replay.report import ReplayReport
from holedger.schemas.events import TaskTerms
from holedger.tasks import load_task

from .runs import DEV, RunWriter, checks, failures_of, honest_finish, terms

SEED = "a" * 40
CAND = "b" * 40


def _run(ledger: Ledger, run_terms: TaskTerms, score: Fraction) -> tuple[str, int]:
    writer = RunWriter(ledger, run_terms)
    writer.commit(SEED)
    writer.commit(CAND)
    rid, _ = writer.request(CAND, "dev", [DEV[0].id], 1)
    seq = writer.trial(rid, CAND, "dev", DEV[0].id, 0, timed_out=True, score=score)
    writer.project(rid, "dev")
    honest_finish(writer, CAND)
    return writer.run_id, seq


def _detail(report: ReplayReport) -> str:
    return next(c.detail for c in report.checks if c.name == "timeouts")


def test_a_timeout_scored_zero_verifies(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    run, _ = _run(ledger, terms(SEED).model_copy(update={"timeout_score": "zero"}), Fraction(0))
    report = replay(run)
    assert report.verified, report.failures
    assert _detail(report) == "1 timed-out trial, each scored 0 as the task's timeouts are"


def test_a_timeout_scored_above_zero_under_the_zero_rule_fails_timeouts(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    run, seq = _run(
        ledger, terms(SEED).model_copy(update={"timeout_score": "zero"}), Fraction(1, 2)
    )
    report = replay(run)
    assert not report.verified
    assert {n for n, ok in checks(report).items() if not ok} == {"timeouts"}
    assert failures_of(report, "timeouts") == [
        f"{seq}:TrialCompleted:trial req-1/{DEV[0].id}/0 timed out and scores 0.5; the "
        "task's timeouts score 0"
    ]


def test_the_verifier_rule_and_old_terms_let_a_timeout_score(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    run, _ = _run(
        ledger, terms(SEED).model_copy(update={"timeout_score": "verifier"}), Fraction(1, 2)
    )
    report = replay(run)
    assert report.verified and "scored by the verifier" in _detail(report)
    old = terms(SEED)
    assert old.timeout_score is None and "timeout_score" not in old.model_dump(mode="json")
    run, _ = _run(ledger, old, Fraction(1, 2))
    report = replay(run)
    assert report.verified and "not judged" in _detail(report)


def test_the_bundled_task_states_the_zero_rule_without_changing_its_digest() -> None:
    task = load_task("officeqa-lite")
    assert task.terms().timeout_score == "zero"
    assert "timeout_score" not in task.spec.model_dump(mode="json")
