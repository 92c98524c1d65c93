"""Model-swap against harness-swap contrasts (A8), native against common wins (A9) and
the multi-harness axis (A10), from cell means.

* Model effect (reading, not stated): the mean |g_m - g_m'| over every unordered model
  pair within every (task, common-scope harness).
* Harness effect: the mean over (model, task) pairs that have a native cell and a cell
  of the reference common harness of |g_native - g_common|.
* Against the bands (reading, not stated): each effect divided by the mean band of the
  tasks of the differences it averages.
* Wins (A9): per pair, the larger mean wins; a tie iff the two means are equal (reading,
  not stated); beyond band iff |delta| > b_t.
* Axis (A10): per task with two or more common harnesses, per model, native minus the
  best common harness, in bands; and every pair of models whose order differs between
  two harnesses (a rank crossing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations
from typing import Any

from holedger.analysis.bands import READING_RESOLVED, in_bands, resolved
from holedger.analysis.grid import Cell
from holedger.analysis.stats import mean, number

READING_MODEL_EFFECT = (
    "A8: model effect = mean |delta g| over every model pair within every "
    "(task, common harness) (reading, not stated)"
)
READING_AGAINST_BANDS = (
    "A8: an effect against the bands is the effect over the mean band of the tasks it "
    "averages (reading, not stated)"
)
READING_TIE = "A9: a tie iff the two cell means are equal (reading, not stated)"


@dataclass
class Pair:
    """One (model, task) with its native and its common cell mean."""

    model: str
    task: str
    native_harness: str
    native: Fraction
    common: Fraction
    band: Fraction

    @property
    def delta(self) -> Fraction:
        return self.native - self.common

    def to_json(self) -> dict[str, Any]:
        winner = "tie" if self.delta == 0 else "native" if self.delta > 0 else "common"
        return {
            "model": self.model,
            "task": self.task,
            "native_harness": self.native_harness,
            "native": number(self.native),
            "common": number(self.common),
            "delta": number(self.delta),
            "band": number(self.band),
            "winner": winner,
            "beyond_band": resolved(self.delta, self.band),
            "in_bands": number(in_bands(self.delta, self.band)),
        }


def native_pairs(cells: Sequence[Cell], reference: str) -> list[Pair]:
    """Every (model, task) with a native cell and a cell of the reference common harness."""
    by_key = {c.key: c for c in cells if c.mean is not None}
    pairs = []
    for c in cells:
        if c.scope != "native" or c.mean is None:
            continue
        common = by_key.get((c.task, c.model, reference))
        if common is None or common.mean is None:
            continue
        pairs.append(Pair(c.model, c.task, c.harness, c.mean, common.mean, c.band))
    return sorted(pairs, key=lambda p: (p.task, p.model, p.native_harness))


def model_effect(cells: Sequence[Cell]) -> tuple[Fraction | None, Fraction | None, int]:
    """(mean |delta| over model pairs within (task, common harness), mean band, pairs)."""
    groups: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for c in cells:
        if c.scope == "common" and c.mean is not None:
            groups[c.task, c.harness].append(c)
    diffs: list[Fraction] = []
    bands: list[Fraction] = []
    for group in groups.values():
        for a, b in combinations(group, 2):
            assert a.mean is not None and b.mean is not None
            diffs.append(abs(a.mean - b.mean))
            bands.append(a.band)
    if not diffs:
        return None, None, 0
    return mean(diffs), mean(bands), len(diffs)


@dataclass
class Contrasts:
    reference: str
    model_effect: Fraction | None
    model_band: Fraction | None
    model_pairs: int
    pairs: list[Pair]
    axis: list[dict[str, Any]]
    crossings: list[dict[str, Any]]

    @property
    def harness_effect(self) -> Fraction | None:
        return mean([abs(p.delta) for p in self.pairs]) if self.pairs else None

    @property
    def harness_band(self) -> Fraction | None:
        return mean([p.band for p in self.pairs]) if self.pairs else None

    @property
    def ratio(self) -> Fraction | None:
        h = self.harness_effect
        if self.model_effect is None or h is None or h == 0:
            return None
        return self.model_effect / h

    def wins(self) -> dict[str, Any]:
        beyond = [p for p in self.pairs if resolved(p.delta, p.band)]
        return {
            "pairs": len(self.pairs),
            "common_wins": sum(p.delta < 0 for p in self.pairs),
            "native_wins": sum(p.delta > 0 for p in self.pairs),
            "ties": sum(p.delta == 0 for p in self.pairs),
            "beyond_band": len(beyond),
            "beyond_band_native_better": sum(p.delta > 0 for p in beyond),
            "beyond_band_common_better": sum(p.delta < 0 for p in beyond),
        }

    def to_json(self) -> dict[str, Any]:
        def against(effect: Fraction | None, band: Fraction | None) -> Any:
            return number(None if effect is None or not band else effect / band)

        return {
            "reference_common_harness": self.reference,
            "model_effect": number(self.model_effect),
            "model_effect_pairs": self.model_pairs,
            "model_effect_in_bands": against(self.model_effect, self.model_band),
            "harness_effect": number(self.harness_effect),
            "harness_effect_pairs": len(self.pairs),
            "harness_effect_in_bands": against(self.harness_effect, self.harness_band),
            "ratio_model_to_harness": number(self.ratio),
            "wins": self.wins(),
            "native_vs_common": [p.to_json() for p in self.pairs],
            "harness_axis": self.axis,
            "rank_crossings": self.crossings,
            "readings": [
                READING_MODEL_EFFECT,
                READING_AGAINST_BANDS,
                READING_TIE,
                READING_RESOLVED,
            ],
        }


def harness_axis(cells: Sequence[Cell]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A10 for every task with two or more common harnesses."""
    axis: list[dict[str, Any]] = []
    crossings: list[dict[str, Any]] = []
    by_task: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        if c.mean is not None:
            by_task[c.task].append(c)
    for task, group in sorted(by_task.items()):
        commons = sorted({c.harness for c in group if c.scope == "common"})
        if len(commons) < 2:
            continue
        for model in sorted({c.model for c in group}):
            own = {c.harness: c for c in group if c.model == model}
            shared = {h: own[h].mean for h in commons if h in own}
            natives = [c for c in own.values() if c.scope == "native"]
            if not shared or not natives:
                continue
            best_h = max(shared, key=lambda h: (shared[h], h))
            best = shared[best_h]
            assert best is not None and natives[0].mean is not None
            delta = natives[0].mean - best
            axis.append(
                {
                    "task": task,
                    "model": model,
                    "native_harness": natives[0].harness,
                    "best_common_harness": best_h,
                    "native_minus_best_common": number(delta),
                    "in_bands": number(in_bands(delta, natives[0].band)),
                    "beyond_band": resolved(delta, natives[0].band),
                    "single_run_cells": sorted(
                        h for h, c in own.items() if c.n == 1 and (h in shared or c in natives)
                    ),
                }
            )
        table = {(c.model, c.harness): c.mean for c in group if c.scope == "common"}
        for h1, h2 in combinations(commons, 2):
            models = sorted(
                m for m in {c.model for c in group} if (m, h1) in table and (m, h2) in table
            )
            for m1, m2 in combinations(models, 2):
                d1 = table[m1, h1] - table[m2, h1]  # type: ignore[operator]
                d2 = table[m1, h2] - table[m2, h2]  # type: ignore[operator]
                if d1 * d2 < 0:
                    crossings.append({"task": task, "models": [m1, m2], "harnesses": [h1, h2]})
    return axis, crossings


def contrasts(cells: Sequence[Cell], reference: str) -> Contrasts:
    effect, band, n = model_effect(cells)
    axis, crossings = harness_axis(cells)
    return Contrasts(reference, effect, band, n, native_pairs(cells, reference), axis, crossings)
