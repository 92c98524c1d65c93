"""Known answers worked by hand for the grid, LSS-lambda, contrasts and the release
ladder, and the properties lambda-hat must have."""

from __future__ import annotations

from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holedger.analysis.bands import indistinguishable_from_zero, resolved, tiers
from holedger.analysis.contrasts import contrasts
from holedger.analysis.grid import Observation, build_grid
from holedger.analysis.ladder import ladders
from holedger.analysis.lss import Refused, _least_squares, fit_lss, lss
from holedger.analysis.stats import average_ranks, median, spearman

B = F(5, 100)


def obs(task: str, model: str, harness: str, g: F | None, **kw: object) -> Observation:
    scope = str(kw.pop("scope", "common"))
    return Observation(task, model, harness, scope, g, B, **kw)  # type: ignore[arg-type]


def test_grid_cells_with_ties_a_missing_cell_a_single_run_and_undefined_g() -> None:
    cells = build_grid(
        [
            obs("s", "A", "oc", F(1, 5), run_id="r1"),
            obs("s", "A", "oc", F(2, 5), run_id="r2"),
            obs("s", "B", "oc", F(1, 5), run_id="r3"),  # a single-run cell, tied with A's min
            obs("t", "A", "oc", F(1, 10), run_id="r4"),
            obs("t", "A", "oc", None, run_id="r5"),  # E(H0) = 1: g undefined
        ]
    )
    by = {c.key: c for c in cells}
    assert set(by) == {("s", "A", "oc"), ("s", "B", "oc"), ("t", "A", "oc")}  # B/t missing
    a = by["s", "A", "oc"]
    assert (a.n, a.mean, min(a.gains), max(a.gains)) == (2, F(3, 10), F(1, 5), F(2, 5))
    assert by["s", "B", "oc"].n == 1 and by["s", "B", "oc"].mean == F(1, 5)
    t = by["t", "A", "oc"]
    assert (t.n, t.undefined, t.mean) == (1, 1, F(1, 10))  # undefined: counted, not averaged
    data = t.to_json()
    assert data["undefined_g"] == 1 and data["runs"] == ["r4", "r5"]
    assert data["mean_g"] == F(1, 10)


def test_two_sided_band_rules_are_strict_and_inclusive() -> None:
    assert not resolved(F(5, 100), B) and resolved(F(-51, 1000), B)
    assert indistinguishable_from_zero(F(-5, 100), B) and not indistinguishable_from_zero(
        F(6, 100), B
    )


THREE = {
    ("A", "s"): F(5, 10),
    ("A", "t"): F(3, 10),
    ("B", "s"): F(4, 10),
    ("B", "t"): F(3, 10),
    ("C", "s"): F(1, 10),
    ("C", "t"): F(2, 10),
}


def test_lss_balanced_known_answer_with_tiers_and_auxiliaries() -> None:
    result = lss(THREE)
    fit = result.fit
    assert fit.fit == "closed form (balanced)"
    assert fit.mu == F(3, 10)
    assert fit.lam == {"A": F(1, 10), "B": F(1, 20), "C": F(-3, 20)}
    assert fit.tau == {"s": F(1, 30), "t": F(-1, 30)}
    # gaps 0.05 <= 0.058 (one tier) and 0.2 (a new one); no replicates: the paper's value
    assert result.tier_list == [["A", "B"], ["C"]]
    assert result.resolution == F(58, 1000) and "paper" in result.resolution_source
    assert result.ranks == {"A": F(5, 4), "B": F(7, 4), "C": F(3)}  # A, B tie on t: 1.5
    z = result.standardized
    assert z["A"] == pytest.approx(0.688995, abs=1e-5)
    assert z["B"] == pytest.approx(0.448805, abs=1e-5)
    assert z["C"] == pytest.approx(-1.137800, abs=1e-5)


def test_two_models_two_tasks_by_hand() -> None:
    fit = fit_lss(
        {("A", "s"): F(2, 10), ("A", "t"): F(4, 10), ("B", "s"): F(0), ("B", "t"): F(2, 10)}
    )
    assert fit.lam == {"A": F(1, 10), "B": F(-1, 10)}
    assert fit.tau == {"s": F(-1, 10), "t": F(1, 10)}


def test_unbalanced_grid_is_refused_or_fitted_by_least_squares() -> None:
    # exactly additive: mu 0.2, tau (-0.1, 0.1), lambda (0.1, 0, -0.1); C on t missing
    means = {
        ("A", "s"): F(2, 10),
        ("A", "t"): F(4, 10),
        ("B", "s"): F(1, 10),
        ("B", "t"): F(3, 10),
        ("C", "s"): F(0),
    }
    with pytest.raises(Refused, match="C on t"):
        fit_lss(means, unbalanced="refuse")
    fit = fit_lss(means)
    assert fit.fit == "least squares (unbalanced)" and fit.missing == [("C", "t")]
    assert fit.mu == F(2, 10)
    assert fit.lam == {"A": F(1, 10), "B": F(0), "C": F(-1, 10)}
    assert fit.tau == {"s": F(-1, 10), "t": F(1, 10)}


def test_a_disconnected_grid_is_refused() -> None:
    with pytest.raises(Refused, match="connect"):
        fit_lss({("A", "s"): F(1, 10), ("B", "s"): F(0), ("C", "t"): F(2, 10), ("D", "t"): F(0)})


def test_resolution_from_replicates_is_the_median_difference() -> None:
    rep1 = {("A", "s"): F(2, 10), ("B", "s"): F(0), ("A", "t"): F(2, 10), ("B", "t"): F(0)}
    rep2 = {("A", "s"): F(1, 10), ("B", "s"): F(1, 10), ("A", "t"): F(1, 10), ("B", "t"): F(1, 10)}
    # lambda rep1: A 0.1, B -0.1; rep2: 0, 0 -> |diff| 0.1 for both -> median 0.1
    result = lss(THREE, by_replicate={1: rep1, 2: rep2})
    assert result.resolution == F(1, 10)
    assert result.tier_list == [["A", "B"], ["C"]]  # the gap B-C is 0.2 > 0.1


grids = st.dictionaries(
    st.tuples(st.sampled_from("ABCD"), st.sampled_from("stu")),
    st.fractions(min_value=-1, max_value=1, max_denominator=20),
    min_size=4,
)


def _connected(means: dict[tuple[str, str], F]) -> bool:
    try:
        fit_lss(means)
    except Refused:
        return False
    return True


@settings(max_examples=60, deadline=None)
@given(grids, st.fractions(min_value=-1, max_value=1, max_denominator=10))
def test_lambda_sums_to_zero_and_ignores_a_task_constant(means: dict, shift: F) -> None:
    if not _connected(means):
        return
    fit = fit_lss(means)
    assert sum(fit.lam.values()) == 0
    task = sorted({t for _, t in means})[0]
    shifted = {k: v + shift if k[1] == task else v for k, v in means.items()}
    assert fit_lss(shifted).lam == fit.lam


@settings(max_examples=60, deadline=None)
@given(grids)
def test_swapping_two_models_swaps_their_lambda(means: dict) -> None:
    if not _connected(means):
        return
    models = sorted({m for m, _ in means})
    a, b = models[0], models[1]
    swap = {a: b, b: a}
    swapped = {(swap.get(m, m), t): v for (m, t), v in means.items()}
    fit, other = fit_lss(means), fit_lss(swapped)
    assert other.lam[a] == fit.lam[b] and other.lam[b] == fit.lam[a]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.fractions(min_value=-1, max_value=1, max_denominator=12), min_size=6, max_size=6)
)
def test_least_squares_of_a_balanced_grid_is_the_closed_form(values: list) -> None:
    keys = [(m, t) for m in "ABC" for t in "st"]
    means = dict(zip(keys, values, strict=True))
    mu, tau, lam = _least_squares(means, ["A", "B", "C"], ["s", "t"])
    closed = fit_lss(means)
    assert (mu, tau, lam) == (closed.mu, closed.tau, closed.lam)


def _contrast_cells() -> list:
    return build_grid(
        [
            obs("s", "A", "oc", F(2, 10)),
            obs("s", "A", "codex", F(3, 10), scope="native"),
            obs("s", "B", "oc", F(1, 10)),
            obs("s", "B", "cc", F(1, 10), scope="native"),
            obs("t", "A", "oc", F(4, 10)),
            obs("t", "A", "codex", F(35, 100), scope="native"),
            obs("t", "B", "oc", F(2, 10)),
            obs("t", "B", "cc", F(3, 10), scope="native"),
        ]
    )


def test_contrasts_known_answer() -> None:
    c = contrasts(_contrast_cells(), "oc")
    assert c.model_effect == F(15, 100)  # |0.2-0.1| and |0.4-0.2|
    assert c.harness_effect == F(625, 10000)  # (0.1 + 0 + 0.05 + 0.1) / 4
    assert c.ratio == F(12, 5)
    assert c.wins() == {
        "pairs": 4,
        "common_wins": 1,
        "native_wins": 2,
        "ties": 1,
        "beyond_band": 2,  # A on t differs by exactly the band: not beyond (strict)
        "beyond_band_native_better": 2,
        "beyond_band_common_better": 0,
    }
    data = c.to_json()
    assert data["model_effect_in_bands"] == 3
    assert any("reading, not stated" in r for r in data["readings"])


def test_harness_axis_native_minus_best_shared_and_rank_crossings() -> None:
    cells = build_grid(
        [
            obs("g", "A", "oc", F(1, 10)),
            obs("g", "A", "goose", F(3, 10)),
            obs("g", "A", "codex", F(2, 10), scope="native"),
            obs("g", "B", "oc", F(2, 10)),
            obs("g", "B", "goose", F(1, 10)),
        ]
    )
    c = contrasts(cells, "oc")
    (row,) = c.axis
    assert row["best_common_harness"] == "goose"
    assert row["native_minus_best_common"] == F(-1, 10)
    assert row["in_bands"] == -2 and row["beyond_band"] is True
    assert c.crossings == [{"task": "g", "models": ["A", "B"], "harnesses": ["goose", "oc"]}]


def test_release_ladders_by_hand() -> None:
    rows = [
        obs("s", f"m{r}", "cc", g, family="F", release=str(r))
        for r, g in ((1, F(1, 10)), (2, F(2, 10)), (3, F(22, 100)))
    ] + [
        obs("s", f"d{i}", "cc", g, family="D", release=d)
        for i, (d, g) in enumerate(
            (("2025-01-01", F(3, 10)), ("2025-06-01", F(1, 10)), ("2026-01-01", F(36, 100)))
        )
    ]
    out, _ = ladders(rows)
    by = {x["family"]: x for x in out}
    f = by["F"]
    assert f["monotone"] == "rising" and f["steps_beyond_band"] == 1
    assert f["first_to_last"] == F(12, 100) and f["first_to_last_beyond_band"]
    d = by["D"]
    assert [r["release"] for r in d["releases"]] == ["2025-01-01", "2025-06-01", "2026-01-01"]
    assert d["monotone"] == "no" and d["steps_beyond_band"] == 2
    assert d["first_to_last_beyond_band"]  # 0.06 > 0.05


def test_ranks_median_spearman_and_tiers_by_hand() -> None:
    assert average_ranks([F(3), F(1), F(3)]) == [F(5, 2), F(1), F(5, 2)]
    assert median([F(1), F(4), F(2), F(3)]) == F(5, 2)
    assert spearman([F(1), F(2), F(3)], [F(3), F(2), F(1)]) == pytest.approx(-1.0)
    assert spearman([F(1), F(1), F(1)], [F(1), F(2), F(3)]) is None
    assert tiers({"a": F(0), "b": F(1, 10), "c": F(2, 10)}, F(1, 10)) == [["c", "b", "a"]]
