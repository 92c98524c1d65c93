"""The one rule for numbers (holedger.numbers): known values worked out by hand."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from fractions import Fraction
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from holedger.demo.run import DemoSummary
from holedger.numbers import (
    Mean,
    amount,
    decimal,
    exact,
    for_json,
    pair,
    percent,
    quantities_for_json,
)
from holedger.output import emit_json


def test_a_quantity_reads_as_three_decimals_rounded_on_its_exact_value() -> None:
    assert decimal(Fraction(117, 144)) == "0.812"  # 0.8125 exactly: a half, to even
    assert decimal(Fraction(3, 16)) == "0.188"  # 0.1875: a half, to even
    assert decimal(Fraction(1, 16)) == "0.062"  # 0.0625: a half, to even
    assert decimal("53/144") == "0.368"  # 0.36805...
    assert decimal(Fraction(2, 3)) == "0.667"
    assert decimal(Fraction(-1, 8)) == "-0.125"
    assert decimal(Fraction(3, 2000)) == "0.002"  # 0.0015: a half, to even
    assert decimal(Fraction(1, 2000)) == "0.000"  # 0.0005: a half, to even
    assert decimal(0) == "0.000" and decimal("1") == "1.000"  # a score is never "0" or "1"
    assert decimal(None) == "-"
    assert decimal("n/a") == "n/a"  # not a number: shown as it is


def test_a_mean_spells_out_the_trials_and_cases_it_is_made_of() -> None:
    # the example of the issue: 117 passing trials of 48 cases x K = 3
    assert Mean.of(Fraction(117, 144), 48, 3).text() == "0.812: 117 of 144 trials over 48 cases"
    # 13/16 is the same number: its counts come from the cases and K, not the fraction
    assert Mean.of(Fraction(13, 16), 48, 3).text() == "0.812: 117 of 144 trials over 48 cases"
    # a pinned E(H0) of 1/3 over 4 cases x K = 2: a score total of 8/3, not a count
    assert Mean.of(Fraction(1, 3), 4, 2).text() == "0.333: 2.667 of 8 trials over 4 cases"
    assert Mean.of(Fraction(1, 2), 5, 2).text() == "0.500: 5 of 10 trials over 5 cases"
    assert Mean.of(Fraction(1), 1, 1).text() == "1.000: 1 of 1 trial over 1 case"
    assert Mean(Fraction(0), 0, 0).text() == "- (no trials)"
    assert Mean.of(Fraction(3, 4), 2, 2) == Mean(Fraction(3), 4, 2)


def test_totals_and_percentages() -> None:
    assert amount(Fraction(5, 2)) == "2.5" and amount(3) == "3" and amount("8/3") == "2.667"
    assert percent(5, 12) == 41.7 and percent(Fraction(1, 2), 4) == 12.5
    assert percent(1, 0) is None


def test_exact_takes_rationals_and_refuses_floats_and_booleans() -> None:
    assert exact("13/16") == Fraction(13, 16) and exact("0.25") == Fraction(1, 4)
    assert exact(3) == Fraction(3)
    assert exact(0.5) is None and exact(True) is None and exact("x") is None


def test_json_gives_each_quantity_as_a_number_and_its_exact_string() -> None:
    assert pair("e_h_plus", "117/144") == {"e_h_plus": 0.8125, "e_h_plus_exact": "0.8125"}
    assert pair("g", Fraction(23, 32)) == {"g": 0.71875, "g_exact": "0.71875"}
    assert pair("g", Fraction(1, 3)) == {"g": 1 / 3, "g_exact": "1/3"}
    assert pair("g", None) == {"g": None, "g_exact": None}
    doc = {
        "run_id": "r",
        "k": 3,
        "g": Fraction(-2, 7),
        "scores": [Fraction(1, 2), Fraction(1)],
        "runs": [{"mean": Fraction(1, 3), "cases": 5}],
        "tags": ["a", "b"],
    }
    assert for_json(doc) == {
        "run_id": "r",
        "k": 3,  # a count stays an integer
        "g": -2 / 7,
        "g_exact": "-2/7",
        "scores": [0.5, 1.0],
        "scores_exact": ["0.5", "1"],
        "runs": [{"mean": 1 / 3, "mean_exact": "1/3", "cases": 5}],
        "tags": ["a", "b"],
    }
    json.dumps(for_json(doc))  # plain JSON, no Fraction left


def test_a_section_of_exact_strings_names_its_quantities() -> None:
    row = {"component": "dev case_passes", "used": "5/4", "limit": "4", "percent": "31.2%"}
    assert for_json(quantities_for_json(row, ("used", "limit"))) == {
        "component": "dev case_passes",
        "used": 1.25,
        "used_exact": "1.25",
        "limit": 4.0,
        "limit_exact": "4",
        "percent": 31.2,
    }
    # a value that is no number is left as it is; a "-" percent (limit 0) is null
    odd = quantities_for_json({"used": "n/a", "percent": "-"}, ("used",))
    assert odd == {"used": "n/a", "percent": None}


@given(st.fractions(max_denominator=10**9).filter(lambda f: abs(f) < 10**6))
def test_the_exact_string_is_the_value_and_the_number_its_nearest_float(value: Fraction) -> None:
    got = pair("q", value)
    assert Fraction(got["q_exact"]) == value
    assert got["q"] == float(value)


def test_demo_json_gives_numbers_as_numbers(tmp_path: Path) -> None:
    """``demo --json`` once made every number a string; now each score is a number with its
    exact string beside it, and the counts are integers."""
    summary = DemoSummary(
        run_id="r",
        verified=True,
        test_score=Fraction(117, 144),
        seed_score=Fraction(53, 144),
        g=Fraction(64, 91),
        resolution_band=Fraction(1, 20),
        backend="bwrap",
        isolation="isolated",
        report=tmp_path / "r.html",
        budget={"dev case_passes": {"used": "5/2", "limit": "4", "percent": "62.5%"}},
        seconds=1.0,
        replay_command="holedger replay r",
        optimizer_log=tmp_path / "r.optimizer.jsonl",
        optimizer_exit=0,
        cases=48,
        k=3,
    )
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        emit_json(summary.to_json())
    doc = json.loads(buffer.getvalue())
    assert doc["test_score"] == 0.8125 and doc["test_score_exact"] == "0.8125"
    assert doc["seed_score_exact"] == "53/144" and doc["g_exact"] == "64/91"
    assert doc["g"] == 64 / 91 and doc["resolution_band"] == 0.05
    assert (doc["cases"], doc["k"], doc["trials"]) == (48, 3, 144)
    assert doc["budget"]["dev case_passes"] == {
        "used": 2.5,
        "used_exact": "2.5",
        "limit": 4.0,
        "limit_exact": "4",
        "percent": 62.5,
    }
