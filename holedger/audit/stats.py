"""The statistics of Harness-Delta Attribution (analyses.md section B), as pure functions.

Every number an audit records is computed here from per-case scores, in exact rationals
where the specification allows it, so replay re-derives each one and compares it exactly:

* :func:`paired_bootstrap` is the significance gate of B1;
* :func:`scale_factor` derives H0scale's k of B2, :func:`majority_vote` and
  :func:`pass_at_k` are its aggregators;
* :func:`decompose` is B4 (ΔS = O + T + G and the capped shares);
* :func:`transfer` is B5's held-out check, :func:`select_by_val` and
  :func:`val_selection` its validation selection, :func:`stratify` B6's artifact
  stratification.

Choices the specification leaves open are marked "(reading, not stated)" in
:data:`READINGS`; every audit output names them.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, TypeVar

from holedger.errors import UsageError

_V = TypeVar("_V", int, Fraction)

DEFAULT_RESAMPLES = 10_000
DEFAULT_ALPHA = Fraction(1, 20)

Aggregator = Literal["majority_vote", "pass_at_k"]
AGGREGATORS: tuple[Aggregator, ...] = ("majority_vote", "pass_at_k")

READINGS: dict[str, str] = {
    "B1.unit": "the resampling unit is the case, paired by case id; each case's attempts "
    "are averaged first",
    "B1.interval": "percentile interval: the ceil(B*alpha/2)-th smallest and largest of "
    "the B resampled differences; significant iff it excludes 0",
    "B1.p": "two-sided p = min(1, 2 * min(#(dS* <= 0), #(dS* >= 0)) / B)",
    "B2.k": "k = max(1, round(mean calls per case of H^ / that of H0)), halves rounded "
    "up; tokens when either harness makes no call; k = 1 when neither comparison exists",
    "B2.aggregate": "H0scale runs k attempts per group; majority vote counts the answers "
    "normalised (strings case-folded, NFKC, whitespace collapsed) and scores the group "
    "with the recorded score of the first attempt giving the winning answer (ties: the "
    "answer seen first; attempts without an answer do not vote); pass@k scores a group "
    "with its best attempt",
    "B4.shares": "o = clip(O/dS, 0, 1), t = clip(T/dS, 0, 1 - o), g = 1 - o - t; no "
    "shares when dS = 0",
    "B5.transfer": "held-out gain = E(H+) - E(H0) of the run's RunScored",
    "B5.val_selection": "the search-selected candidate is the nominee H^; the val-selected "
    "one has the best val score (mean over its val cases of per-case means; ties: H^, "
    "else the first committed), scored on every test case K times by a control "
    "evaluation when it is not H^; held-out gains are against the pinned E(H0)",
    "B6.tags": "a case's tags are the strings under 'tags' (or the string under 'type') "
    "in its input",
    "B6.held_out": "held-out strata pair H^'s per-case test scores (the run's RunScored) "
    "with H0's (the pinned seed-baseline run's RunScored), per tag",
    "B6.left_out": "a type is left out of the search set when no dev or val case of the "
    "task carries it; near-perfect test performance on it is S_test(H^) >= 19/20",
}
NEAR_PERFECT = Fraction(19, 20)


# --------------------------------------------------------------------------- B1


def case_means(scores: Mapping[str, Sequence[Fraction]]) -> dict[str, Fraction]:
    """Each case's mean over its attempts (cases without a trial are left out)."""
    return {
        case: sum(values, Fraction(0)) / len(values) for case, values in scores.items() if values
    }


def percentile_interval(ordered: Sequence[_V], alpha: Fraction) -> tuple[_V, _V]:
    """The percentile interval of sorted bootstrap values at level 1 - alpha (a reading:
    the ceil(B*alpha/2)-th smallest and the ceil(B*alpha/2)-th largest)."""
    if not ordered:
        raise UsageError("a percentile interval needs at least one value")
    cut = max(1, math.ceil(len(ordered) * alpha / 2))
    return ordered[cut - 1], ordered[len(ordered) - cut]


@dataclass(frozen=True)
class GateResult:
    """The paired bootstrap of ΔS = S(Ĥ) - S(H0) over the paired cases."""

    cases: tuple[str, ...]
    s_candidate: Fraction
    s_base: Fraction
    delta: Fraction
    resamples: int
    seed: int
    alpha: Fraction
    low: Fraction
    high: Fraction
    p_value: Fraction
    significant: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "cases": list(self.cases),
            "s_candidate": _q(self.s_candidate),
            "s_base": _q(self.s_base),
            "delta": _q(self.delta),
            "resamples": self.resamples,
            "seed": self.seed,
            "alpha": _q(self.alpha),
            "interval": [_q(self.low), _q(self.high)],
            "p_value": _q(self.p_value),
            "significant": self.significant,
        }


def paired_bootstrap(
    candidate: Mapping[str, Fraction],
    base: Mapping[str, Fraction],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    alpha: Fraction = DEFAULT_ALPHA,
) -> GateResult:
    """B1: resample the paired cases with replacement ``resamples`` times (the same ids
    for both harnesses, so each draw is a case's difference), and test ΔS against 0.

    ``candidate`` and ``base`` map case ids to per-case mean scores; only cases in both
    are paired. The differences are scaled to integers so every resampled ΔS* is exact.
    """
    if resamples < 1:
        raise UsageError(f"the bootstrap needs at least one resample, not {resamples}")
    if not 0 < alpha < 1:
        raise UsageError(f"alpha must lie strictly between 0 and 1, not {alpha}")
    cases = tuple(sorted(set(candidate) & set(base)))
    n = len(cases)
    if n == 0:
        raise UsageError(
            "no case was evaluated on both harnesses: nothing to pair",
            hint="evaluate both on the same search cases (control evaluations)",
        )
    diffs = [Fraction(candidate[c]) - Fraction(base[c]) for c in cases]
    scale = math.lcm(*(d.denominator for d in diffs))
    ints = [int(d * scale) for d in diffs]
    rng = random.Random(seed)
    choices = rng.choices
    sums = sorted(sum(choices(ints, k=n)) for _ in range(resamples))
    denominator = n * scale
    low_sum, high_sum = percentile_interval(sums, alpha)
    at_most = _count_at_most(sums, 0)
    at_least = resamples - _count_below(sums, 0)
    p_value = min(Fraction(1), Fraction(2 * min(at_most, at_least), resamples))
    low, high = Fraction(low_sum, denominator), Fraction(high_sum, denominator)
    s_candidate = sum((Fraction(candidate[c]) for c in cases), Fraction(0)) / n
    s_base = sum((Fraction(base[c]) for c in cases), Fraction(0)) / n
    return GateResult(
        cases=cases,
        s_candidate=s_candidate,
        s_base=s_base,
        delta=s_candidate - s_base,
        resamples=resamples,
        seed=seed,
        alpha=alpha,
        low=low,
        high=high,
        p_value=p_value,
        significant=low > 0 or high < 0,
    )


def _count_below(ordered: Sequence[int], value: int) -> int:
    return bisect.bisect_left(ordered, value)


def _count_at_most(ordered: Sequence[int], value: int) -> int:
    return bisect.bisect_right(ordered, value)


# --------------------------------------------------------------------------- B2


@dataclass(frozen=True)
class ScaleFactor:
    """H0scale's k and what it was matched on."""

    k: int
    basis: Literal["calls", "tokens", "none"]
    candidate_mean: Fraction
    base_mean: Fraction
    adds_compute: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "basis": self.basis,
            "candidate_mean": _q(self.candidate_mean),
            "base_mean": _q(self.base_mean),
            "adds_compute": self.adds_compute,
        }


def round_half_up(value: Fraction) -> int:
    return math.floor(value + Fraction(1, 2))


def scale_factor(
    candidate_calls: Fraction,
    base_calls: Fraction,
    candidate_tokens: Fraction,
    base_tokens: Fraction,
) -> ScaleFactor:
    """B2's k from the mean executor calls per case of Ĥ and H0; tokens when calls are not
    comparable (either harness makes none), else k = 1 with basis "none"."""
    if candidate_calls > 0 and base_calls > 0:
        basis: Literal["calls", "tokens", "none"] = "calls"
        num, den = candidate_calls, base_calls
    elif candidate_tokens > 0 and base_tokens > 0:
        basis, num, den = "tokens", candidate_tokens, base_tokens
    else:
        return ScaleFactor(1, "none", candidate_calls, base_calls, False)
    k = max(1, round_half_up(num / den))
    return ScaleFactor(k, basis, num, den, k > 1)


def normalize_answer(answer: Any) -> str:
    """An answer's vote key: strings NFKC, case-folded, whitespace collapsed, inside any
    JSON structure; then canonical text."""

    def norm(value: Any) -> Any:
        if isinstance(value, str):
            return " ".join(unicodedata.normalize("NFKC", value).casefold().split())
        if isinstance(value, list):
            return [norm(v) for v in value]
        if isinstance(value, dict):
            return {str(k): norm(v) for k, v in value.items()}
        return value

    return json.dumps(norm(answer), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def majority_vote(attempts: Sequence[tuple[Any | None, Fraction]]) -> Fraction:
    """One group's score by majority vote: ``attempts`` are (answer or None, score) in
    attempt order; the winning normalised answer's first attempt gives the score."""
    counts: dict[str, int] = {}
    first: dict[str, Fraction] = {}
    for answer, score in attempts:
        if answer is None:
            continue
        key = normalize_answer(answer)
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, Fraction(score))
    if not counts:
        return Fraction(0)
    best = max(counts.values())
    winner = next(key for key in first if counts[key] == best)  # insertion order: seen first
    return first[winner]


def pass_at_k(attempts: Sequence[tuple[Any | None, Fraction]]) -> Fraction:
    """One group's score by pass@k: its best attempt."""
    return max((Fraction(score) for _, score in attempts), default=Fraction(0))


def aggregate_case(
    attempts: Sequence[tuple[Any | None, Fraction]], k: int, aggregator: Aggregator
) -> Fraction:
    """A case's H0scale score: its attempts (in attempt order) cut into groups of k, each
    aggregated, the groups averaged. A trailing group shorter than k is refused."""
    if k < 1 or not attempts or len(attempts) % k:
        raise UsageError(f"{len(attempts)} attempts do not make whole groups of {k}")
    combine = majority_vote if aggregator == "majority_vote" else pass_at_k
    groups = [combine(attempts[i : i + k]) for i in range(0, len(attempts), k)]
    return sum(groups, Fraction(0)) / len(groups)


# --------------------------------------------------------------------------- B4


def _clip(value: Fraction, low: Fraction, high: Fraction) -> Fraction:
    return max(low, min(high, value))


@dataclass(frozen=True)
class Decomposition:
    """B4 on the search set: the four scores, the terms and the capped shares."""

    s_candidate: Fraction
    s_base: Fraction
    s_scaled: Fraction
    s_neutral: Fraction
    delta: Fraction
    t: Fraction
    o: Fraction
    g: Fraction
    shares: tuple[Fraction, Fraction, Fraction] | None  # (o, t, g)
    identity_holds: bool

    def as_json(self) -> dict[str, Any]:
        shares = None
        if self.shares is not None:
            o, t, g = self.shares
            shares = {"o": _q(o), "t": _q(t), "g": _q(g)}
        return {
            "s_candidate": _q(self.s_candidate),
            "s_base": _q(self.s_base),
            "s_scaled": _q(self.s_scaled),
            "s_neutral": _q(self.s_neutral),
            "delta": _q(self.delta),
            "T": _q(self.t),
            "O": _q(self.o),
            "G": _q(self.g),
            "O_bound": "lower",
            "G_bound": "upper",
            "shares": shares,
            "identity_holds": self.identity_holds,
        }


def decompose(
    s_candidate: Fraction, s_base: Fraction, s_scaled: Fraction, s_neutral: Fraction
) -> Decomposition:
    """ΔS = S(Ĥ) - S(H0) = O + T + G with T = S(H0scale) - S(H0), O = S(Ĥ) - S(Ĥneutral)
    (a lower bound: only detected, removed overfitting), G = S(Ĥneutral) - S(H0scale) (an
    upper bound, not evidence of transfer); shares capped as B4 reads."""
    delta = s_candidate - s_base
    t = s_scaled - s_base
    o = s_candidate - s_neutral
    g = s_neutral - s_scaled
    shares = None
    if delta != 0:
        share_o = _clip(o / delta, Fraction(0), Fraction(1))
        share_t = _clip(t / delta, Fraction(0), 1 - share_o)
        shares = (share_o, share_t, 1 - share_o - share_t)
    return Decomposition(
        s_candidate, s_base, s_scaled, s_neutral, delta, t, o, g, shares, o + t + g == delta
    )


# --------------------------------------------------------------------------- B5, B6


def transfer(search_delta: Fraction, held_out_delta: Fraction) -> dict[str, Any]:
    """B5: the held-out gain against the search gain."""
    return {
        "search_delta": _q(search_delta),
        "held_out_delta": _q(held_out_delta),
        "below_search": held_out_delta < search_delta,
        "below_half_search": held_out_delta < search_delta / 2,
        "below_zero": held_out_delta < 0,
    }


def select_by_val(
    val_means: Mapping[str, Fraction], order: Sequence[str], nominee: str
) -> str | None:
    """B5: the candidate with the best val score (ties: the nominee if it is tied, else the
    one committed first); None when no candidate was evaluated on val."""
    if not val_means:
        return None
    best = max(val_means.values())
    tied = [c for c in order if val_means.get(c) == best]
    return nominee if nominee in tied else tied[0]


def val_selection(
    search_selected: str,
    val_selected: str,
    held_out_search: Fraction,
    held_out_val: Fraction,
    search_delta: Fraction,
) -> dict[str, Any]:
    """B5 validation selection for one setting: the held-out gain of the val-selected
    candidate against the search-selected one's, and against the search gain."""
    return {
        "search_selected": search_selected,
        "val_selected": val_selected,
        "held_out_search_selected": _q(held_out_search),
        "held_out_val_selected": _q(held_out_val),
        "improves": held_out_val > held_out_search,
        "worsens": held_out_val < held_out_search,
        "val_below_search_gain": held_out_val < search_delta,
    }


def case_tags(case_input: Any) -> list[str]:
    """A case's artifact or type tags (a reading: ``tags`` strings, else ``type``)."""
    if not isinstance(case_input, dict):
        return []
    tags = case_input.get("tags")
    if isinstance(tags, list):
        return sorted({t for t in tags if isinstance(t, str)})
    kind = case_input.get("type")
    return [kind] if isinstance(kind, str) else []


def stratify(
    candidate: Mapping[str, Fraction],
    base: Mapping[str, Fraction],
    tags: Mapping[str, Sequence[str]],
) -> list[dict[str, Any]]:
    """B6: per tag (and untagged), the paired cases' S(Ĥ), S(H0) and their difference."""
    groups: dict[str, list[str]] = {}
    for case in sorted(set(candidate) & set(base)):
        for tag in tags.get(case) or ["(untagged)"]:
            groups.setdefault(tag, []).append(case)
    rows = []
    for tag, cases in sorted(groups.items()):
        s_c = sum((candidate[c] for c in cases), Fraction(0)) / len(cases)
        s_b = sum((base[c] for c in cases), Fraction(0)) / len(cases)
        rows.append(
            {
                "tag": tag,
                "cases": len(cases),
                "s_candidate": _q(s_c),
                "s_base": _q(s_b),
                "delta": _q(s_c - s_b),
            }
        )
    return rows


def left_out_types(
    candidate: Mapping[str, Fraction],
    base: Mapping[str, Fraction],
    tags: Mapping[str, Sequence[str]],
    search_tags: set[str],
) -> list[dict[str, Any]]:
    """B6 leave-type-out: per tag of the held-out cases that no search case carries, S_test
    of Ĥ and H0 over its paired cases and whether Ĥ's is near-perfect (>= 19/20), which
    means the proposer's prior knowledge was distilled into the harness: overfitting."""
    rows = []
    for row in stratify(candidate, base, tags):
        if row["tag"] == "(untagged)" or row["tag"] in search_tags:
            continue
        near = Fraction(row["s_candidate"]) >= NEAR_PERFECT
        rows.append({**row, "near_perfect": near})
    return rows


def _q(value: Fraction) -> str:
    """An exact rational as canonical text."""
    from holedger.schemas.canonical import rational_to_str

    return rational_to_str(Fraction(value))
