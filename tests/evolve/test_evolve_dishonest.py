"""A dishonest server is caught: a solve-evolve log re-signed by the key holder with one lie
in it fails replay, by the check's name."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.protocol import evolve, rules
from holedger.schemas.events import NoneRun

from .writer import H1, H2, SEED, EvolveWriter, failed

PROMPT = ["harness/prompts/p.txt"]


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = Ledger.open(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        SigningKey.generate("evolve-test"),
        checkpoint_interval=16,
    )
    yield led
    led.close()


def _honest_first_step(w: EvolveWriter) -> None:
    w.solve(1, SEED, {"dev-0": 0, "dev-1": 1})
    w.commit(H1, SEED, PROMPT)
    w.close_step(1, "committed", SEED, H1)


def test_an_honest_log_verifies_and_j_is_recomputed(ledger: Ledger) -> None:
    w = EvolveWriter(ledger)
    _honest_first_step(w)
    w.solve(2, H1, {"dev-2": 1, "dev-3": 1})
    w.close_step(2, "unchanged", H1, H1)
    w.solve(3, H1, {"dev-4": 0, "dev-5": 1})
    w.close_step(3, "unchanged", H1, H1)
    w.finish()
    report = w.replay()
    assert report.verified, failed(report)
    names = {c.name: c for c in report.checks}
    for name in (
        "evolve_steps",
        "evolve_parent",
        "evolve_scores_fixed",
        "evolve_scope",
        "evolve_step_budget",
        "in_situ",
    ):
        assert names[name].ok
    # 4 of 6 cases pass: J = 2/3
    assert report.sections["solve_evolve"]["j"] == "2/3"
    assert "J 0.667" in names["in_situ"].detail or "2/3" in names["in_situ"].detail


def test_a_step_scored_by_h_t_instead_of_h_t_minus_1_is_caught(ledger: Ledger) -> None:
    w = EvolveWriter(ledger)
    _honest_first_step(w)
    # step 2's batch is scored by H_2, the harness made from step 2's own evidence
    w.commit(H2, H1, PROMPT)
    w.solve(2, H2, {"dev-2": 1, "dev-3": 1})
    w.close_step(2, "unchanged", H2, H2)
    report = w.replay()
    checks = failed(report)
    assert "evolve_parent" in checks, checks
    assert any(
        "step 2's trials run cccccccccccc, not H_1 bbbbbbbbbbbb" in f.reason
        for f in report.failures
    )


def test_a_score_recorded_after_its_evidence_was_disclosed_is_caught(ledger: Ledger) -> None:
    w = EvolveWriter(ledger)
    rid = w.request(1, SEED, ["dev-0", "dev-1"])
    w.trial(rid, SEED, "dev-0", 0)
    w.project(rid)  # the evidence goes out with dev-1 not scored yet
    w.trial(rid, SEED, "dev-1", 1)
    w.close_step(1, "unchanged", SEED, SEED)
    report = w.replay()
    checks = failed(report)
    assert "evolve_scores_fixed" in checks, checks
    assert any("after the evidence that disclosed its step" in f.reason for f in report.failures)


def test_a_commit_outside_the_editable_scope_is_caught(ledger: Ledger) -> None:
    w = EvolveWriter(ledger)
    w.solve(1, SEED, {"dev-0": 0, "dev-1": 1})
    w.commit(H1, SEED, ["harness/__main__.py"])  # the scope is harness/prompts/ only
    w.close_step(1, "committed", SEED, H1)
    for step in (2, 3):
        w.solve(step, H1, {f"dev-{2 * step - 2}": 1, f"dev-{2 * step - 1}": 1})
        w.close_step(step, "unchanged", H1, H1)
    w.finish()
    report = w.replay()
    assert set(failed(report)) == {"evolve_scope"}, failed(report)
    assert (
        "changes 'harness/__main__.py', outside the editable scope"
        in failed(report)["evolve_scope"]
    )


def test_two_commits_in_one_step_are_caught(ledger: Ledger) -> None:
    w = EvolveWriter(ledger)
    w.solve(1, SEED, {"dev-0": 0, "dev-1": 1})
    w.commit(H1, SEED, PROMPT)
    w.commit(H2, SEED, PROMPT)
    w.close_step(1, "committed", SEED, H2)
    report = w.replay()
    checks = failed(report)
    assert "evolve_steps" in checks, checks
    assert any("a second commit in step 1" in f.reason for f in report.failures)


def test_a_skipped_step_is_caught(ledger: Ledger) -> None:
    w = EvolveWriter(ledger)
    _honest_first_step(w)
    w.solve(3, H1, {"dev-4": 1, "dev-5": 1})  # X_3 scored as the second step
    w.close_step(3, "unchanged", H1, H1)
    w.finish()
    report = w.replay()
    checks = failed(report)
    assert "evolve_steps" in checks, checks
    assert any("not X_2 = [dev-2, dev-3]" in f.reason for f in report.failures)
    assert any("closed after 2 of its 3 steps" in f.reason for f in report.failures)


def test_step_events_in_a_search_run_are_caught(ledger: Ledger) -> None:
    from sample_terms import sha, task_terms

    from holedger.schemas.events import StepClosed

    run_id = ledger.open_run(task_terms(), task_digest=sha("t"), optimizer="search")
    closed = StepClosed(
        step=1,
        outcome="unchanged",
        parent=SEED,
        candidate=SEED,
        request_id="r",
        projection_digest="0" * 64,
        evolver_tokens=0,
    )
    ledger.append(run_id, "StepClosed", closed, "server")
    ledger.close_run(run_id, "completed", {})
    from holedger.replay.runs import replay_run

    assert "evolve_steps" in failed(replay_run(ledger, run_id))


def _none_run(ledger: Ledger) -> tuple[str, NoneRun]:
    none = EvolveWriter(ledger, optimizer=evolve.NONE_OPTIMIZER)
    for step, cases in enumerate((("dev-0", "dev-1"), ("dev-2", "dev-3"), ("dev-4", "dev-5"))):
        none.solve(step + 1, SEED, {c: int(c != "dev-0" and c != "dev-3") for c in cases})
        none.close_step(step + 1, "unchanged", SEED, SEED)
    none.finish()
    per_case = [(f"dev-{i}", [Fraction(int(i not in (0, 3)))]) for i in range(6)]
    pinned = NoneRun(
        run_id=none.run_id, j=Fraction(2, 3), per_case_digest=rules.per_case_digest(per_case)
    )
    return none.run_id, pinned


def _evolved_run(ledger: Ledger, pinned: NoneRun) -> EvolveWriter:
    w = EvolveWriter(ledger, none_run=pinned)
    _honest_first_step(w)
    for step in (2, 3):
        w.solve(step, H1, {f"dev-{2 * step - 2}": 1, f"dev-{2 * step - 1}": 1})
        w.close_step(step, "unchanged", H1, H1)
    w.finish()
    return w


def test_the_pinned_none_run_is_replayed_and_a_false_base_is_caught(ledger: Ledger) -> None:
    _, pinned = _none_run(ledger)
    honest = _evolved_run(ledger, pinned).replay()
    assert honest.verified, failed(honest)
    none_check = next(c for c in honest.checks if c.name == "none_run")
    assert none_check.ok and "Base 0.667" in none_check.detail
    # J = 5/6 (dev-0 failed under the seed), Base 2/3: delta 1/6
    assert honest.sections["solve_evolve"]["delta"] == "1/6"
    lying = _evolved_run(ledger, pinned.model_copy(update={"j": Fraction(1, 2)})).replay()
    assert "none_run" in failed(lying), failed(lying)
    assert "scored J 2/3, the pin says 0.5" in failed(lying)["none_run"]
