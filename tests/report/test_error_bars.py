"""Error bars: the standard error of the K round means, against values worked by hand."""

from __future__ import annotations

import math
from fractions import Fraction as F

import pytest

from holedger.replay.html.stats import (
    held_out_standard_error,
    round_means,
    standard_error,
)


def test_the_rounds_are_attempts_across_cases() -> None:
    per_case = {"a": [F(1), F(0), F(1)], "b": [F(1), F(1), F(0)]}
    # round 0: (1 + 1) / 2, round 1: (0 + 1) / 2, round 2: (1 + 0) / 2
    assert round_means(per_case) == [F(1), F(1, 2), F(1, 2)]


def test_standard_error_of_three_round_means_by_hand() -> None:
    # round means 1, 1/2, 1/2: mean 2/3; squared deviations 1/9 + 1/36 + 1/36 = 1/6;
    # sample variance (1/6) / 2 = 1/12; SE^2 = (1/12) / 3 = 1/36: SE = 1/6
    per_case = {"a": [F(1), F(0), F(1)], "b": [F(1), F(1), F(0)]}
    assert held_out_standard_error(per_case) == pytest.approx(1 / 6, abs=1e-15)


def test_it_is_not_the_spread_across_cases() -> None:
    # every round scores 1/2 (one case always passes, one always fails): the rounds agree,
    # so the error bar is 0, though the cases differ as much as they can
    per_case = {"pass": [F(1), F(1), F(1)], "fail": [F(0), F(0), F(0)]}
    assert held_out_standard_error(per_case) == 0.0
    assert standard_error([F(1), F(0)]) == pytest.approx(0.5)  # across cases it is large


def test_known_values() -> None:
    # 0, 1: mean 1/2, variance (1/4 + 1/4) / 1 = 1/2, SE = sqrt(1/2 / 2) = 1/2
    assert standard_error([F(0), F(1)]) == pytest.approx(0.5, abs=1e-15)
    # 1/4, 1/2, 3/4: mean 1/2, variance (1/16 + 0 + 1/16) / 2 = 1/16, SE = sqrt(1/48)
    assert standard_error([F(1, 4), F(1, 2), F(3, 4)]) == pytest.approx(math.sqrt(1 / 48))
    assert standard_error([F(1, 3)] * 4) == 0.0
    assert standard_error([F(1)]) is None and standard_error([]) is None
    assert held_out_standard_error({}) is None
    assert held_out_standard_error({"a": [F(1)]}) is None  # K = 1: one round, no bar
