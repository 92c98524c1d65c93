"""E(H+)'s and the pinned E(H0)'s error bar (A3): the standard error of the K round means,
worked by hand; RunScored carrying a forged one fails ``scores``."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction as F

from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.replay.report import ReplayReport
from holedger.schemas.events import RoundError

from .runs import TEST, K, RunWriter, checks, failures_of, honest_search, score_of, terms

SEED = "a" * 40
CAND = "b" * 40


def test_round_means_and_their_standard_error_by_hand() -> None:
    # three cases, K = 3: round r is attempt r of every case
    per_case = [[F(1), F(0), F(1)], [F(0), F(0), F(1)], [F(1, 2), F(0), F(1)]]
    assert rules.round_means(per_case) == [F(1, 2), F(0), F(1)]
    # mean 1/2; squared deviations 0, 1/4, 1/4; / (3 - 1) = 1/4; / K = 1/12
    assert rules.round_se([F(1, 2), F(0), F(1)]) == f"{math.sqrt(1 / 12):.9f}" == "0.288675135"
    # rounds 1/2, 1/4, 3/4: deviations 0, -1/4, 1/4 -> 1/8 / 2 / 3 = 1/48
    assert rules.round_se([F(1, 2), F(1, 4), F(3, 4)]) == "0.144337567"
    assert rules.round_se([F(1), F(1), F(1)]) == "0.000000000"
    assert rules.round_se([F(1, 3)]) is None  # K = 1: no spread to measure
    assert rules.round_means([[F(1), F(0)], [F(1)]]) == []  # cases scored unequally often
    error = rules.round_error(per_case)
    assert error == RoundError(round_means=[F(1, 2), F(0), F(1)], se="0.288675135")


def _scored_run(ledger: Ledger, **override: object) -> tuple[str, int]:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    writer.nominate(CAND)
    writer.heldout(CAND)
    seq = writer.scored(CAND, **override)
    writer.close()
    return writer.run_id, seq


def _honest_error() -> RoundError:
    error = rules.round_error([[score_of(CAND, c.id, a) for a in range(K)] for c in TEST])
    assert error is not None
    return error


def test_recorded_error_bar_of_the_trials_verifies(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    error = _honest_error()
    run, _ = _scored_run(ledger, e_h_plus_error=error)
    report = replay(run)
    assert report.verified, report.failures
    assert report.sections["scores"]["e_h_plus_se"] == error.se
    assert report.sections["scores"]["e_h0_se"] is None  # the pin carries none


def test_a_forged_error_bar_fails_scores(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    error = _honest_error()
    forged = RoundError(round_means=error.round_means, se="0.000000001")
    run, seq = _scored_run(ledger, e_h_plus_error=forged)
    report = replay(run)
    assert {n for n, ok in checks(report).items() if not ok} == {"scores"}
    (failure,) = failures_of(report, "scores")
    assert failure.startswith(f"{seq}:RunScored:RunScored's E(H+) error bar se 0.000000001")


def test_an_e_h0_error_bar_the_pin_does_not_hold_fails_scores(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    invented = RoundError(round_means=[F(1, 3), F(1, 3)], se="0.000000000")
    run, seq = _scored_run(ledger, e_h0_error=invented)
    (failure,) = failures_of(replay(run), "scores")
    assert failure == (
        f"{seq}:RunScored:RunScored's E(H0) error bar se 0.000000000 of rounds [1/3, 1/3] "
        "is not the pinned one (none)"
    )
