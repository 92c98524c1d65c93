"""Small exact statistics shared by the cross-run analyses: means, medians, ranks with
ties, Spearman's rho, and the JSON form of an exact value beside its float.

Everything that is a rational stays a :class:`fractions.Fraction`; only what needs a
square root (a standard deviation, a correlation) is a float.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction


def mean(values: Sequence[Fraction]) -> Fraction:
    """The arithmetic mean (of at least one value)."""
    return sum(values, Fraction(0)) / len(values)


def median(values: Sequence[Fraction]) -> Fraction:
    """The median; of an even count, the mean of the two middle values."""
    ordered = sorted(values)
    n = len(ordered)
    middle = n // 2
    if n % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def sample_sd(values: Sequence[Fraction]) -> float | None:
    """The sample standard deviation (n - 1); None for fewer than two values."""
    if len(values) < 2:
        return None
    centre = mean(values)
    square = sum(((v - centre) ** 2 for v in values), Fraction(0)) / (len(values) - 1)
    return math.sqrt(square)


def average_ranks(values: Sequence[Fraction], descending: bool = False) -> list[Fraction]:
    """Rank 1 for the smallest (largest when ``descending``); tied values share the mean
    of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i], reverse=descending)
    ranks = [Fraction(0)] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        rank = Fraction(start + 1 + end + 1, 2)
        for i in order[start : end + 1]:
            ranks[i] = rank
        start = end + 1
    return ranks


def spearman(xs: Sequence[Fraction], ys: Sequence[Fraction]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks. None for fewer than
    three pairs or when either side is constant (rho undefined)."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = mean(rx), mean(ry)
    cov = sum(((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)), Fraction(0))
    vx = sum(((a - mx) ** 2 for a in rx), Fraction(0))
    vy = sum(((b - my) ** 2 for b in ry), Fraction(0))
    if vx == 0 or vy == 0:
        return None
    return float(cov) / math.sqrt(float(vx) * float(vy))


def number(value: Fraction | None) -> Fraction | None:
    """A quantity as the analyses' JSON carries it: the exact rational, which the output
    gives as ``q`` (a float) and ``q_exact`` (its exact string) (``holedger.numbers``)."""
    return value


def fmt(value: Fraction | float | None, signed: bool = True, digits: int = 3) -> str:
    """A value for a text table: '-' when there is none."""
    if value is None:
        return "-"
    return f"{float(value):{'+' if signed else ''}.{digits}f}"


def round_means_se(per_case: Sequence[Sequence[Fraction]]) -> tuple[list[Fraction], float | None]:
    """The K round means (round r = attempt r of every case) and their standard error,
    sd(round means, n - 1) / sqrt(K) (A3, reading, not stated); None for K < 2 or cases
    scored a different number of times."""
    if not per_case or len({len(s) for s in per_case}) != 1:
        return [], None
    k = len(per_case[0])
    rounds = [mean([scores[r] for scores in per_case]) for r in range(k)]
    sd = sample_sd(rounds)
    return rounds, None if sd is None else sd / math.sqrt(k)
