"""Resolution bands (A5): the two-sided rules by which a difference is judged, tiers, and
the band derived from paired re-scorings of one candidate.

A band b_t is a per-task descriptive threshold, not a significance test:

* a difference is *resolved* iff |delta| > b_t (strict: reading, not stated);
* a gain is *indistinguishable from 0* iff |g| <= b_t;
* an effect can be quoted in multiples of the band, delta / b_t;
* tiers (reading, not stated): sort the values, start a new tier where the gap between
  adjacent values exceeds the band; never order within a tier.

The band from evidence (reading, not stated): b_t = median over re-scored candidates c
of |E1(c) - E2(c)| / (1 - E(H0, t)), each E a full K = 3 test scoring; a re-scoring with
k' attempts instead of 3 is multiplied by sqrt(k'/3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from holedger.analysis.stats import median

READING_RESOLVED = "A5: a difference is resolved iff |delta| > b (strict) (reading, not stated)"
READING_TIERS = (
    "A5/A7: tiers start where the gap between adjacent sorted values exceeds the "
    "resolution (reading, not stated)"
)
READING_DERIVED_BAND = (
    "A5: b_t = median over re-scored candidates of |E1 - E2| / (1 - E(H0)), scaled by "
    "sqrt(k'/3) for k' attempts (reading, not stated)"
)


def resolved(delta: Fraction, band: Fraction) -> bool:
    """A difference the band resolves: |delta| > b."""
    return abs(delta) > band


def indistinguishable_from_zero(g: Fraction, band: Fraction) -> bool:
    """A gain the band cannot tell from no change: |g| <= b."""
    return abs(g) <= band


def in_bands(delta: Fraction, band: Fraction) -> Fraction | None:
    """delta in multiples of the band (None for a zero band)."""
    return None if band == 0 else delta / band


def tiers(values: dict[str, Fraction], resolution: Fraction) -> list[list[str]]:
    """The names, sorted by value descending (then by name), cut into tiers wherever the
    gap between adjacent values exceeds ``resolution``."""
    ordered = sorted(values, key=lambda name: (-values[name], name))
    out: list[list[str]] = []
    for name in ordered:
        if out and values[out[-1][-1]] - values[name] <= resolution:
            out[-1].append(name)
        else:
            out.append([name])
    return out


@dataclass(frozen=True)
class Rescoring:
    """Two full scorings of one candidate on the same test cases."""

    e_first: Fraction
    e_second: Fraction
    e_h0: Fraction
    attempts: int = 3


def derived_band(rescorings: Sequence[Rescoring]) -> float | None:
    """b_t from paired re-scorings; None when there are none (or E(H0) = 1 for all)."""
    scaled: list[Fraction] = []
    factors: list[float] = []
    for r in rescorings:
        if r.e_h0 == 1:
            continue
        scaled.append(abs(r.e_first - r.e_second) / (1 - r.e_h0))
        factors.append(math.sqrt(r.attempts / 3))
    if not scaled:
        return None
    if all(f == 1.0 for f in factors):
        return float(median(scaled))
    return float(median([Fraction(float(v) * f) for v, f in zip(scaled, factors, strict=True)]))
