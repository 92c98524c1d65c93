"""The HDA statistics against values worked out by hand, and the gate's error rates."""

from __future__ import annotations

import random
from fractions import Fraction as F

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holedger.audit.stats import (
    aggregate_case,
    case_means,
    decompose,
    majority_vote,
    paired_bootstrap,
    pass_at_k,
    percentile_interval,
    round_half_up,
    scale_factor,
    stratify,
    transfer,
)
from holedger.errors import UsageError


def test_case_means_average_each_case_over_its_attempts() -> None:
    assert case_means({"a": [F(1), F(0), F(1)], "b": [F(0)], "c": []}) == {"a": F(2, 3), "b": 0}


def test_percentile_interval_takes_the_ceil_b_alpha_half_th_values() -> None:
    values = list(range(1, 101))  # B = 100, alpha 0.05: cut = ceil(2.5) = 3
    assert percentile_interval(values, F(1, 20)) == (3, 98)
    assert percentile_interval(list(range(10)), F(1, 20)) == (0, 9)  # cut at least 1


def test_a_constant_gain_is_significant_with_p_zero() -> None:
    gate = paired_bootstrap({"a": F(1), "b": F(1)}, {"a": F(0), "b": F(0)}, resamples=500)
    assert (gate.delta, gate.low, gate.high, gate.p_value) == (1, 1, 1, 0)
    assert gate.significant


def test_no_difference_is_not_significant_with_p_one() -> None:
    gate = paired_bootstrap({"a": F(1), "b": F(0)}, {"a": F(1), "b": F(0)}, resamples=200)
    assert (gate.delta, gate.low, gate.high, gate.p_value, gate.significant) == (0, 0, 0, 1, False)


def test_two_cases_one_gain_gives_p_one_half_by_hand() -> None:
    # d = (1, 0): a resample's mean is 0 with probability 1/4, 1/2 w.p. 1/2, 1 w.p. 1/4.
    # P(dS* <= 0) = 1/4 and P(dS* >= 0) = 1, so p = 2 * 1/4 = 1/2; the interval is [0, 1].
    gate = paired_bootstrap({"a": F(1), "b": F(1)}, {"a": F(0), "b": F(1)}, seed=3)
    assert gate.delta == F(1, 2)
    assert abs(float(gate.p_value) - 0.5) < 0.03
    assert (gate.low, gate.high) == (0, 1)
    assert not gate.significant


def test_only_cases_of_both_harnesses_are_paired() -> None:
    gate = paired_bootstrap({"a": F(1), "x": F(1)}, {"a": F(0), "y": F(0)}, resamples=10)
    assert gate.cases == ("a",)
    with pytest.raises(UsageError, match="no case was evaluated on both"):
        paired_bootstrap({"x": F(1)}, {"y": F(0)})


def test_the_seed_is_the_whole_randomness() -> None:
    cand = {f"c{i}": F(i % 3, 2) for i in range(30)}
    base = {f"c{i}": F(i % 2, 2) for i in range(30)}
    one = paired_bootstrap(cand, base, resamples=300, seed=11)
    assert one == paired_bootstrap(cand, base, resamples=300, seed=11)
    assert one.as_json()["seed"] == 11


def _simulate(effect: float, sims: int, seed: int) -> float:
    """Share of significant gates over ``sims`` synthetic searches: 40 cases with their
    own success probability, 2 attempts per case, the candidate ``effect`` better."""
    rng = random.Random(seed)
    hits = 0
    for sim in range(sims):
        cand, base = {}, {}
        for i in range(40):
            p = rng.random()
            q = min(1.0, p + effect)
            cand[str(i)] = F(sum(rng.random() < q for _ in range(2)), 2)
            base[str(i)] = F(sum(rng.random() < p for _ in range(2)), 2)
        hits += paired_bootstrap(cand, base, resamples=200, seed=sim).significant
    return hits / sims


@pytest.mark.slow
def test_false_positive_rate_on_nulls_is_near_alpha() -> None:
    rate = _simulate(0.0, 2000, seed=7)
    print(f"false-positive rate at alpha 0.05 over 2000 null simulations: {rate:.4f}")
    assert 0.04 <= rate <= 0.06


def test_power_on_a_known_effect_is_reported() -> None:
    power = _simulate(0.25, 200, seed=8)
    print(f"power at a per-case effect of +0.25 (40 cases, 2 attempts): {power:.3f}")
    assert power > 0.5  # far above alpha: the gate sees a real effect


def test_k_is_the_rounded_ratio_of_calls() -> None:
    k = scale_factor(F(10), F(2), F(0), F(0))
    assert (k.k, k.basis, k.adds_compute) == (5, "calls", True)
    assert scale_factor(F(5), F(2), F(0), F(0)).k == 3  # 2.5 rounds half up
    assert scale_factor(F(9, 4), F(1), F(0), F(0)).k == 2
    assert round_half_up(F(-1, 2)) == 0


def test_k_falls_back_to_tokens_then_to_one() -> None:
    k = scale_factor(F(3), F(0), F(900), F(300))
    assert (k.k, k.basis) == (3, "tokens")
    none = scale_factor(F(0), F(0), F(0), F(0))
    assert (none.k, none.basis, none.adds_compute) == (1, "none", False)


def test_no_added_compute_means_k_one() -> None:
    k = scale_factor(F(1), F(2), F(10), F(20))
    assert (k.k, k.adds_compute) == (1, False)


def test_majority_vote_normalises_answers_and_scores_the_winner() -> None:
    attempts = [("Paris ", F(1)), ("london", F(0)), ("PARIS", F(1)), (None, F(0))]
    assert majority_vote(attempts) == 1
    assert majority_vote([("b", F(0)), ("a", F(1))]) == 0  # tie: the answer seen first
    assert majority_vote([(None, F(0))]) == 0
    assert majority_vote([({"v": " X"}, F(1)), ({"v": "x"}, F(1)), ({"v": "y"}, F(0))]) == 1


def test_pass_at_k_takes_the_best_attempt() -> None:
    assert pass_at_k([("a", F(0)), ("b", F(1, 2)), (None, F(0))]) == F(1, 2)


def test_aggregate_case_averages_groups_of_k() -> None:
    attempts = [("a", F(1)), ("a", F(1)), ("b", F(0)), ("b", F(0)), ("c", F(1)), ("b", F(0))]
    assert aggregate_case(attempts, 3, "majority_vote") == F(1, 2)  # groups: 1, then 0
    assert aggregate_case(attempts, 2, "pass_at_k") == F(2, 3)  # 1, 0, 1
    with pytest.raises(UsageError):
        aggregate_case(attempts, 4, "pass_at_k")


def test_decomposition_by_hand() -> None:
    # S(H0) = 0.4, S(H0scale) = 0.5, S(Hn) = 0.55, S(H^) = 0.8: dS = 0.4
    d = decompose(F(8, 10), F(4, 10), F(5, 10), F(55, 100))
    assert (d.delta, d.t, d.o, d.g) == (F(2, 5), F(1, 10), F(1, 4), F(1, 20))
    assert d.shares == (F(5, 8), F(1, 4), F(1, 8))
    assert d.identity_holds
    assert d.as_json()["O_bound"] == "lower" and d.as_json()["G_bound"] == "upper"


def test_shares_are_capped() -> None:
    # O larger than dS: o = 1, t capped at 0, g = 0.
    d = decompose(F(6, 10), F(5, 10), F(7, 10), F(2, 10))
    assert d.shares == (1, 0, 0)
    # negative O and T: o = 0, t = 0, g = 1
    d = decompose(F(6, 10), F(5, 10), F(4, 10), F(7, 10))
    assert d.shares == (0, 0, 1)
    assert decompose(F(1, 2), F(1, 2), F(1, 2), F(1, 2)).shares is None


def test_transfer_flags() -> None:
    t = transfer(F(2, 5), F(1, 10))
    assert (t["below_search"], t["below_half_search"], t["below_zero"]) == (True, True, False)
    assert transfer(F(2, 5), F(-1, 10))["below_zero"]


def test_stratify_by_tag() -> None:
    rows = stratify(
        {"a": F(1), "b": F(1), "c": F(0)},
        {"a": F(0), "b": F(1), "c": F(0)},
        {"a": ["meta"], "b": ["meta"]},
    )
    assert rows == [
        {"tag": "(untagged)", "cases": 1, "s_candidate": "0", "s_base": "0", "delta": "0"},
        {"tag": "meta", "cases": 2, "s_candidate": "1", "s_base": "0.5", "delta": "0.5"},
    ]


_score = st.fractions(min_value=0, max_value=1, max_denominator=60)


@given(_score, _score, _score, _score)
def test_terms_sum_to_the_gain_and_shares_to_one(a: F, b: F, c: F, d: F) -> None:
    parts = decompose(a, b, c, d)
    assert parts.identity_holds and parts.o + parts.t + parts.g == parts.delta
    if parts.delta == 0:
        assert parts.shares is None
    else:
        assert parts.shares is not None
        o, t, g = parts.shares
        assert 0 <= o <= 1 and 0 <= t <= 1 - o and o + t + g == 1


def test_left_out_types_by_hand() -> None:
    from holedger.audit.stats import left_out_types

    # test cases: t1, t2 of type "geo" (left out of the search), t3 of "alg" (searched)
    cand = {"t1": F(1), "t2": F(19, 20), "t3": F(0)}
    base = {"t1": F(1, 2), "t2": F(0), "t3": F(0)}
    tags = {"t1": ["geo"], "t2": ["geo"], "t3": ["alg"]}
    [geo] = left_out_types(cand, base, tags, search_tags={"alg"})
    # S_test(H^) = (1 + 19/20)/2 = 39/40 >= 19/20: near-perfect; S_test(H0) = 1/4
    assert geo == {
        "tag": "geo",
        "cases": 2,
        "s_candidate": "0.975",
        "s_base": "0.25",
        "delta": "0.725",
        "near_perfect": True,
    }
    # just under 19/20 is not near-perfect; a searched type is never listed
    cand["t2"] = F(17, 20)  # mean 37/40 < 38/40
    [geo] = left_out_types(cand, base, tags, search_tags={"alg"})
    assert geo["s_candidate"] == "0.925" and geo["near_perfect"] is False
    assert left_out_types(cand, base, tags, search_tags={"alg", "geo"}) == []


def test_val_selection_by_hand() -> None:
    from holedger.audit.stats import select_by_val, val_selection

    order = ["seed", "a", "b", "c"]
    # b and c tie on the best val score: the first committed (b) unless H^ is tied
    means = {"seed": F(1, 2), "a": F(3, 4), "b": F(7, 8), "c": F(7, 8)}
    assert select_by_val(means, order, nominee="a") == "b"
    assert select_by_val(means, order, nominee="c") == "c"
    assert select_by_val({}, order, nominee="a") is None
    # held-out gains: search-selected 1/10, val-selected 1/20; search gain 1/5
    v = val_selection("a", "b", F(1, 10), F(1, 20), F(1, 5))
    assert v == {
        "search_selected": "a",
        "val_selected": "b",
        "held_out_search_selected": "0.1",
        "held_out_val_selected": "0.05",
        "improves": False,
        "worsens": True,
        "val_below_search_gain": True,
    }
    # the val-selected one better on held-out, and above the search gain
    v = val_selection("a", "b", F(1, 10), F(1, 4), F(1, 5))
    assert (v["improves"], v["worsens"], v["val_below_search_gain"]) == (True, False, False)
