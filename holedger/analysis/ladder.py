"""The release ladder (A11): g per release of one model family on one task (and one
harness), whether the sequence is monotone, how many adjacent steps exceed the band, and
whether first-to-last does.

Releases sort as the descriptor states them: ordinals by number, dates by date (an
ordinal and a date in one family cannot be ordered and leave that family out).
Monotone (reading, not stated): every step >= 0 (rising) or every step <= 0 (falling);
a step is beyond band iff |delta g| > b (strict). Several runs of one release are
averaged (their cell mean).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from holedger.analysis.bands import READING_RESOLVED, resolved
from holedger.analysis.grid import Observation
from holedger.analysis.stats import mean, number

READING_MONOTONE = (
    "A11: monotone means every step >= 0 (rising) or every step <= 0 (falling) "
    "(reading, not stated)"
)


def _release_key(release: str) -> tuple[int, int | str]:
    return (0, int(release)) if release.isdigit() else (1, release)


def ladders(observations: Sequence[Observation]) -> tuple[list[dict[str, Any]], list[str]]:
    """One ladder per (task, family, harness) with at least two releases, and notes on the
    runs left out."""
    series: dict[tuple[str, str, str], dict[str, list[Fraction]]] = defaultdict(
        lambda: defaultdict(list)
    )
    bands: dict[str, Fraction] = {}
    models: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
    left_out = 0
    for obs in observations:
        if obs.family is None or obs.release is None or obs.g is None:
            left_out += 1
            continue
        key = (obs.task, obs.family, obs.harness)
        series[key][obs.release].append(obs.g)
        models[(*key, obs.release)].add(obs.model)
        bands[obs.task] = max(bands.get(obs.task, obs.band), obs.band)
    notes = []
    if left_out:
        notes.append(f"{left_out} observation(s) without a family, a release or a defined g")
    out = []
    for (task, family, harness), by_release in sorted(series.items()):
        kinds = {r.isdigit() for r in by_release}
        if len(kinds) > 1:
            notes.append(f"{family} on {task}: ordinals and dates mixed; not ordered")
            continue
        if len(by_release) < 2:
            continue
        releases = sorted(by_release, key=_release_key)
        g = [mean(by_release[r]) for r in releases]
        band = bands[task]
        steps = [b - a for a, b in itertools.pairwise(g)]
        rising, falling = all(s >= 0 for s in steps), all(s <= 0 for s in steps)
        out.append(
            {
                "task": task,
                "family": family,
                "harness": harness,
                "band": number(band),
                "releases": [
                    {
                        "release": r,
                        "models": sorted(models[(task, family, harness, r)]),
                        "n": len(by_release[r]),
                        "g": number(v),
                    }
                    for r, v in zip(releases, g, strict=True)
                ],
                "steps": [number(s) for s in steps],
                "monotone": "rising" if rising else "falling" if falling else "no",
                "steps_beyond_band": sum(resolved(s, band) for s in steps),
                "first_to_last": number(g[-1] - g[0]),
                "first_to_last_beyond_band": resolved(g[-1] - g[0], band),
            }
        )
    return out, notes


READINGS = [READING_MONOTONE, READING_RESOLVED]
