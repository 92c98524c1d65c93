"""The report's typed timeline: built in the replay of a real run, against values worked out
by hand; and the page rendered from a timeline built by hand, with no ledger at all."""

from __future__ import annotations

from fractions import Fraction as F
from pathlib import Path

import pytest
from ledger.recorded_run import record_run

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.html import Timeline, replay_timeline

from .rich_run import record_rich_run
from .synthetic_run import case_ids


def _ledger(tmp_path: Path) -> Ledger:
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    return Ledger.from_settings(cfg)


@pytest.fixture()
def rich(tmp_path: Path) -> Timeline:
    ledger = _ledger(tmp_path)
    try:
        run = record_rich_run(ledger, tmp_path)
        report, timeline = replay_timeline(ledger, run.run_id)
    finally:
        ledger.close()
    # the log is intact (the hand-written run fails two semantic checks: its trials report
    # tokens without model calls, and the baseline run is a bare RunScored)
    assert report.failed_checks() == ["baseline", "gateway_trial_totals"]
    assert timeline.verification.judged_on == "" and not timeline.verification.verified
    return timeline


def test_candidates_evaluations_and_per_case_scores(rich: Timeline) -> None:
    t = rich
    assert t.header.task_id == "synthetic" and t.header.optimizer == "synthetic-optimizer"
    assert t.header.close_reason == "completed" and t.header.closed_at is not None
    assert [c.index for c in t.candidates] == [0, 1, 2]
    seed, first, second = (c.commit for c in t.candidates)
    assert [c.parent for c in t.candidates] == [None, seed, first]
    # 3 dev requests, 2 val, 1 held-out; 3 + 3 + 3 + 6 + 6 + 5 * 2 trials
    assert [(e.split, e.candidate) for e in t.evaluations] == [
        ("dev", seed),
        ("dev", first),
        ("dev", second),
        ("val", seed),
        ("val", second),
        ("test", second),
    ]
    assert len(t.trials) == 31
    dev = case_ids("dev")
    # the seed's dev scores cycle [0, 1/2] over cases 0..2: 0, 1/2, 0, mean 1/6
    assert t.evaluations[0].by_case == {dev[0]: [F(0)], dev[1]: [F(1, 2)], dev[2]: [F(0)]}
    assert [e.mean for e in t.evaluations[:5]] == [F(1, 6), F(2, 3), F(5, 6), F(1, 4), F(5, 6)]
    # tokens of a trial on case i: 1000 + 40 i; the held-out request scores 5 cases twice
    assert t.evaluations[0].tokens == 1000 + 1040 + 1080
    assert t.evaluations[5].tokens == 2 * (5 * 1000 + 40 * (0 + 1 + 2 + 3 + 4))
    assert [d.split for d in t.disclosures] == ["dev", "dev", "dev", "val", "val"]
    assert [(v.category, v.trial_id) for v in t.violations] == [("timeout", "req-3-syn-dev-000-0")]
    assert t.usage == ()  # no model call was made


def test_nominee_held_out_scores_and_the_seed_baseline(rich: Timeline) -> None:
    t = rich
    second = t.candidates[2].commit
    assert t.nominated == second
    held = t.held_out
    assert held is not None and held.candidate == second and held.k == 2
    test = case_ids("test")
    # attempt a of case i scores [1, 1, 1/2, 1][(i + a) % 4]
    assert held.per_case[test[1]] == (F(1), F(1, 2))
    assert held.per_case[test[2]] == (F(1, 2), F(1))
    # case means 1, 3/4, 3/4, 1, 1: E(H+) = 9/10; g = (9/10 - 1/3) / (2/3) = 17/20
    assert (held.e_h_plus, held.e_h0, held.g) == (F(9, 10), F(1, 3), F(17, 20))
    assert held.standard_error == 0.0  # both round means are 9/10
    base = t.baseline
    assert base is not None and base.run_id == t.header.seed_baseline.baseline_run_id  # type: ignore[union-attr]
    # cases 0 and 3 score [1, 0], the others [0, 4/9]: round means 2/5 and 4/15, whose
    # sample variance is 2/225, so the standard error is sqrt(2/225 / 2) = 1/15
    assert base.per_case[test[0]] == (F(1), F(0)) and base.per_case[test[4]] == (F(0), F(4, 9))
    assert base.standard_error == pytest.approx(1 / 15, abs=1e-15)
    scores = t.verification.scores
    assert scores is not None and scores.e_h_plus == F(9, 10)
    assert scores.band_outcome == "resolved gain"  # g = 17/20 > b


def test_gateway_usage_per_scope(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    try:
        run_id = record_run(ledger, rounds=2)
        _, t = replay_timeline(ledger, run_id)
    finally:
        ledger.close()
    # 2 rounds of 5 trials, 3 calls each, totals 120, 122 and 124 tokens
    assert [(u.scope, u.calls, u.denied, u.tokens) for u in t.usage] == [
        ("target", 30, 0, 10 * (120 + 122 + 124))
    ]
    assert (t.gateway_calls, t.gateway_denied) == (30, 0)
    assert [e.mean for e in t.evaluations] == [F(0), F(1, 2)]
    assert len(t.candidates) == 2 and t.nominated == t.candidates[1].commit
