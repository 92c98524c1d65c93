"""The pure rules shared by the server (to decide) and replay (to check)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holedger.errors import PolicyError
from holedger.protocol import rules
from holedger.protocol.refusals import legacy_code
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import BudgetVector, DisclosurePolicy, SplitBudget

from .runs import TEST, VAL, K, terms

POLICY = DisclosurePolicy(min_aggregate_cases=5)


def _view(case: str, attempt: int, score: Fraction) -> rules.TrialView:
    return rules.TrialView(case_id=case, attempt=attempt, score=score, answer={"a": case})


def test_cost_is_one_call_and_the_exact_fraction_of_a_case_pass() -> None:
    cost = rules.request_cost(split_size=30, n_cases=5, attempts=2)
    assert cost.calls == 1
    assert cost.case_passes == Fraction(1, 3)


def test_a_request_that_exactly_fits_is_accepted_and_one_more_is_not() -> None:
    budget = BudgetVector(
        dev=SplitBudget(calls=2, case_passes=Fraction(1)),
        val=SplitBudget(calls=1, case_passes=Fraction(1)),
        target_tokens=0,
    )
    half = rules.request_cost(4, 2, 1)
    used = rules.add_use(rules.no_use(), "dev", half)
    assert rules.budget_decision(budget, used, "dev", half) is None
    used = rules.add_use(used, "dev", half)
    reason = rules.budget_decision(budget, used, "dev", rules.request_cost(4, 1, 1))
    assert reason is not None and reason.code == "budget.calls"
    assert reason.text.startswith("dev calls budget exceeded")
    tiny = rules.request_cost(4, 1, 1)
    used_val = rules.add_use(rules.no_use(), "val", rules.request_cost(4, 4, 1))
    budget2 = budget.model_copy(update={"val": SplitBudget(calls=5, case_passes=Fraction(1))})
    reason = rules.budget_decision(budget2, used_val, "val", tiny)
    assert reason is not None and reason.code == "budget.case_passes"
    assert reason.text.startswith("val case_passes budget exceeded")


def test_the_test_split_is_not_charged() -> None:
    used = rules.add_use(rules.no_use(), "test", rules.request_cost(4, 4, 3))
    assert used == rules.no_use()


@settings(max_examples=200, deadline=None)
@given(
    calls=st.integers(0, 6),
    passes=st.fractions(min_value=0, max_value=4, max_denominator=12),
    requests=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 3)), max_size=20),
)
def test_following_the_gate_never_overspends(
    calls: int, passes: Fraction, requests: list[tuple[int, int]]
) -> None:
    split = SplitBudget(calls=calls, case_passes=passes)
    budget = BudgetVector(dev=split, val=split, target_tokens=0)
    used = rules.no_use()
    for n_cases, attempts in requests:
        cost = rules.request_cost(12, n_cases, attempts)
        if rules.budget_decision(budget, used, "dev", cost) is None:
            used = rules.add_use(used, "dev", cost)
    assert used.dev.calls <= calls
    assert used.dev.case_passes <= passes


@pytest.mark.parametrize(
    ("split", "cases", "attempts", "nominated", "expected", "code"),
    [
        ("dev", ["rp-dev-0"], 0, False, "attempts must be at least 1", "protocol.attempts"),
        ("dev", [], 1, False, "no cases requested", "protocol.no_cases"),
        (
            "dev",
            ["rp-dev-0", "rp-dev-0"],
            1,
            False,
            "requested more than once",
            "protocol.repeated_case",
        ),
        (
            "test",
            [c.id for c in TEST],
            K,
            False,
            "closed until a candidate is nominated",
            "protocol.test_sealed",
        ),
        ("test", [c.id for c in TEST], 1, True, f"K={K} attempts", "protocol.heldout_attempts"),
        ("dev", ["rp-dev-9"], 1, False, "not in the dev split", "protocol.unknown_case"),
        ("val", [c.id for c in VAL[:4]], 1, False, "at least 5 cases", "protocol.val_min_cases"),
        ("sideways", ["x"], 1, False, "unknown split", "protocol.unknown_split"),
        ("val", [c.id for c in VAL[:5]], 1, False, None, None),
        ("test", [c.id for c in TEST], K, True, None, None),
    ],
)
def test_request_problems(
    split: str,
    cases: list[str],
    attempts: int,
    nominated: bool,
    expected: str | None,
    code: str | None,
) -> None:
    known = {"dev": {f"rp-dev-{i}" for i in range(4)}, "val": {c.id for c in VAL}}
    known["test"] = {c.id for c in TEST}
    reason = rules.request_problem(
        terms(), split, cases, attempts, nominated=nominated, known_cases=known.get(split)
    )
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason.text and reason.code == code
        # the wording logs used before codes were recorded still reads as the same code
        assert legacy_code(reason.text) == code


def test_dev_projection_is_per_case_with_scores_answers_and_digests() -> None:
    views = [_view("b", 1, Fraction(1)), _view("b", 0, Fraction(0)), _view("a", 0, Fraction(1))]
    policy, body = rules.project("dev", POLICY, views)
    assert policy == "per_case"
    assert body["trials"] == 3
    assert body["cases"]["b"]["mean"] == "0.5"
    assert [t["attempt"] for t in body["cases"]["b"]["trials"]] == [0, 1]
    assert body["cases"]["a"]["trials"][0]["answer"] == {"a": "a"}


def _sized(case: str, attempt: int, size: int) -> rules.TrialView:
    """A trial whose answer's canonical JSON is exactly ``size`` bytes."""
    answer = "x" * (size - 2)  # the two quotes make up the rest
    assert len(rules.answer_bytes(answer)) == size
    return rules.TrialView(
        case_id=case,
        attempt=attempt,
        score=Fraction(1),
        answer=answer,
        answer_digest=rules.answer_digest(answer),
    )


def _shown(body: dict[str, object], case: str, attempt: int) -> dict[str, object]:
    (trial,) = [t for t in body["cases"][case]["trials"] if t["attempt"] == attempt]  # type: ignore[index]
    return trial  # type: ignore[no-any-return]


def test_a_dev_answer_over_the_size_cap_is_shown_by_digest_only() -> None:
    cap = rules.MAX_SHOWN_ANSWER_BYTES
    views = [_sized("a", 0, cap), _sized("a", 1, cap + 1)]
    _, body = rules.project("dev", POLICY, views)
    at_cap, over = _shown(body, "a", 0), _shown(body, "a", 1)
    assert at_cap["answer"] == views[0].answer and "answer_in_blob" not in at_cap
    assert over["answer"] is None and over["answer_in_blob"] is True
    assert over["answer_digest"] == views[1].answer_digest
    # An answer whose bytes are unknown is shown by digest too; a missing answer is null.
    unknown = rules.TrialView("b", 0, Fraction(0), answer_digest="d" * 64, answer_known=False)
    absent = rules.TrialView("c", 0, Fraction(0))
    _, body = rules.project("dev", POLICY, [unknown, absent])
    assert _shown(body, "b", 0)["answer_in_blob"] is True
    assert _shown(body, "c", 0)["answer"] is None
    assert "answer_in_blob" not in _shown(body, "c", 0)


def test_answers_shown_in_one_projection_stop_at_the_total_cap_in_case_order() -> None:
    each = rules.MAX_SHOWN_ANSWER_BYTES
    fit = rules.MAX_SHOWN_ANSWERS_BYTES // each
    views = [_sized(f"case-{i:03d}", 0, each) for i in range(fit + 2)]
    views.append(_sized("zz-small", 0, 10))
    views.append(rules.TrialView("zz-none", 0, Fraction(0)))
    # The line is drawn in case-id order, whatever order the trials come in.
    _, body = rules.project("dev", POLICY, list(reversed(views)))
    assert body == rules.project("dev", POLICY, views)[1]
    inline = sorted(c for c in body["cases"] if "answer_in_blob" not in _shown(body, c, 0))
    assert inline == [f"case-{i:03d}" for i in range(fit)] + ["zz-none"]
    assert len(canonical_json(body)) < rules.MAX_SHOWN_ANSWERS_BYTES + 64 * 1024


def test_the_total_cap_is_first_fit_and_ordered_by_code_point() -> None:
    size = 65_000  # 64 of these fit in 4 MiB, the 65th does not
    views = [_sized(f"c{i:03d}", 0, size) for i in range(66)]
    inline = rules.shown_inline([*views, _sized("zz", 0, 10)])
    assert ("c063", 0) in inline and ("c064", 0) not in inline
    assert ("zz", 0) in inline  # an answer that does not fit uses none of the 4 MiB
    # Case ids are walked in code-point order (as canonical JSON sorts names), which for
    # these two is not UTF-16 order.
    bmp, astral = "\uff21", "\U0001f600"
    assert sorted([bmp, astral], key=lambda s: s.encode("utf-16-be")) == [astral, bmp]
    filler = [_sized(bmp, a, rules.MAX_SHOWN_ANSWER_BYTES) for a in range(64)]
    inline = rules.shown_inline([_sized(astral, 0, 10), *filler])
    assert (bmp, 63) in inline and (astral, 0) not in inline


def test_only_the_trials_digest_fields_are_fetchable() -> None:
    inner = "e" * 64
    body = {
        "cases": {
            "c": {
                "mean": "1",
                "trials": [
                    {
                        "attempt": 0,
                        "answer": {"evidence_digest": inner, "text": inner},
                        "answer_digest": "a" * 64,
                        "trace_digest": "b" * 64,
                    }
                ],
            }
        },
        "trials": 1,
    }
    assert rules.fetchable_digests(body) == {"a" * 64, "b" * 64}
    assert rules.fetchable_digests({"cases": 3, "trials": 3, "mean": "1"}) == set()


def test_val_projection_is_the_aggregate_mean_only() -> None:
    views = [_view(f"c{i}", 0, Fraction(i % 2)) for i in range(5)]
    views.append(_view("c0", 1, Fraction(1)))  # c0: mean 1/2, so mean of means 1/2
    policy, body = rules.project("val", POLICY, views)
    assert policy == "aggregate"
    assert body == {"cases": 5, "trials": 6, "mean": "0.5"}
    with pytest.raises(PolicyError, match="below the minimum 5"):
        rules.project("val", POLICY, views[:4])
    with pytest.raises(PolicyError, match="never disclosed"):
        rules.project("test", POLICY, views)


def test_projection_digest_is_order_independent_and_content_sensitive() -> None:
    a = rules.projection_digest({"cases": 5, "trials": 5, "mean": "1/3"})
    b = rules.projection_digest({"mean": "1/3", "trials": 5, "cases": 5})
    c = rules.projection_digest({"mean": "1/2", "trials": 5, "cases": 5})
    assert a == b != c


def test_expected_score_is_the_mean_of_per_case_means_and_gain_is_normalised() -> None:
    e_plus = rules.expected_score({"x": [Fraction(1), Fraction(0)], "y": [Fraction(1)] * 2})
    assert e_plus == Fraction(3, 4)
    assert rules.normalized_gain(e_plus, Fraction(1, 2)) == Fraction(1, 2)
    assert rules.normalized_gain(Fraction(1, 4), Fraction(1, 2)) == Fraction(-1, 2)
    assert rules.normalized_gain(Fraction(1), Fraction(1)) is None
    with pytest.raises(ValueError, match="no values"):
        rules.mean([])


def test_a_gain_against_the_band_is_one_of_a5s_three_outcomes_two_sided() -> None:
    b = Fraction(1, 20)
    # E(H0) = 1/2, E(H+) = 3/4: g = (1/4) / (1/2) = 1/2 > 1/20, a resolved gain
    assert rules.band_outcome(rules.normalized_gain(Fraction(3, 4), Fraction(1, 2)), b) == (
        rules.RESOLVED_GAIN
    )
    # E(H+) = 1/4: g = -1/2 < -1/20, a resolved loss (one-sided "not above" hid it)
    assert rules.band_outcome(rules.normalized_gain(Fraction(1, 4), Fraction(1, 2)), b) == (
        rules.RESOLVED_LOSS
    )
    # E(H0) = 3/5, E(H+) = 31/50: g = (1/50) / (2/5) = 1/20 = b, the boundary: |g| <= b
    g = rules.normalized_gain(Fraction(31, 50), Fraction(3, 5))
    assert g == b and rules.band_outcome(g, b) == rules.INDISTINGUISHABLE
    # and on the other side: E(H+) = 29/50, g = -1/20 = -b, indistinguishable too
    g = rules.normalized_gain(Fraction(29, 50), Fraction(3, 5))
    assert g == -b and rules.band_outcome(g, b) == rules.INDISTINGUISHABLE
    # just past the boundary on both sides: |g| = 1/20 + 1/1000 > b
    assert rules.band_outcome(Fraction(51, 1000), b) == rules.RESOLVED_GAIN
    assert rules.band_outcome(Fraction(-51, 1000), b) == rules.RESOLVED_LOSS
    assert rules.band_outcome(Fraction(49, 1000), b) == rules.INDISTINGUISHABLE
    assert rules.band_outcome(Fraction(0), Fraction(0)) == rules.INDISTINGUISHABLE
    assert rules.band_outcome(None, b) is None  # g undefined at E(H0) = 1
    assert rules.band_outcome_text(rules.RESOLVED_LOSS, "0.050") == (
        "resolved loss: |g| > b, resolution band 0.050"
    )
    assert rules.band_outcome_text(rules.INDISTINGUISHABLE, "0.050") == (
        "indistinguishable from 0: |g| <= b, resolution band 0.050"
    )
