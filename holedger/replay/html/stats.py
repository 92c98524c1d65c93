"""The error bars of the report: standard errors of means, from the exact scores.

Held-out scores (analyses A3): each test case is scored K times; round r is attempt r over
all cases, and the error bar of E(H+) (or E(H0)) is the standard error of the K round
means, ``sd(round means, n - 1) / sqrt(K)``, not the spread across cases. A dev or val
mean of one evaluation request, whose cases may be scored once each, gets the standard
error of its per-case means the same way, ``sd(case means, n - 1) / sqrt(n)``. With fewer
than two values there is no error bar (None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction


def standard_error(values: Sequence[Fraction]) -> float | None:
    """The standard error of the mean of ``values``: the sample standard deviation (n - 1
    in the denominator) over the square root of n. The variance is computed exactly; only
    the square root is a float."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values, Fraction(0)) / n
    variance = sum(((v - mean) ** 2 for v in values), Fraction(0)) / (n - 1)
    return math.sqrt(variance / n)


def round_means(per_case: Mapping[str, Sequence[Fraction]]) -> list[Fraction]:
    """The K round means of held-out scores: round r is the mean over cases of attempt r.
    Only rounds every case has are counted (a case scored fewer times ends the rounds)."""
    if not per_case:
        return []
    k = min(len(scores) for scores in per_case.values())
    return [sum((s[r] for s in per_case.values()), Fraction(0)) / len(per_case) for r in range(k)]


def held_out_standard_error(per_case: Mapping[str, Sequence[Fraction]]) -> float | None:
    """The error bar of a held-out score: the standard error of its K round means."""
    return standard_error(round_means(per_case))
