"""The results grid (A6): one observation per scored run (or per cell of a published
table), grouped into cells (task, optimizer model, coding harness) with mean, min-max
range and n, beside the task's band.

Qualifying replicates (reading, not stated): runs that are closed, nominated and
test-scored; a run whose g is undefined (E(H0) = 1) is counted in the cell's ``runs``
but left out of its mean (A4 reading). The range is the observed min and max, not a CI.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from holedger.analysis.bands import indistinguishable_from_zero
from holedger.analysis.stats import mean, number

READING_QUALIFYING = (
    "A6: qualifying replicates are runs closed, nominated and test-scored (reading, not stated)"
)
READING_NO_CLIP = "A4: g is not clipped, so g < -1 is possible (reading, not stated)"
READING_UNDEFINED_G = (
    "A4: g is undefined when E(H0) = 1; such runs are reported and left out of means "
    "(reading, not stated)"
)


@dataclass(frozen=True)
class Observation:
    """One g with the signed fields that place it in the grid.

    From a run: its descriptor and RunScored. From a table: one cell's published mean
    (``run_id`` None, ``replicate`` None, nothing verified).
    """

    task: str
    model: str
    harness: str
    scope: str  # "native" or "common"
    g: Fraction | None
    band: Fraction
    run_id: str | None = None
    replicate: int | None = None
    family: str | None = None
    release: str | None = None
    e_h_plus: Fraction | None = None
    e_h0: Fraction | None = None

    def who(self) -> dict[str, str | None]:
        """The members that say whose run a row of an analysis is."""
        return {
            "run_id": self.run_id,
            "task": self.task,
            "model": self.model,
            "harness": self.harness,
        }


Key = tuple[str, str, str]  # (task, model, harness)


@dataclass
class Cell:
    task: str
    model: str
    harness: str
    scope: str
    band: Fraction
    gains: list[Fraction] = field(default_factory=list)
    undefined: int = 0
    run_ids: list[str] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.task, self.model, self.harness)

    @property
    def n(self) -> int:
        return len(self.gains)

    @property
    def mean(self) -> Fraction | None:
        return mean(self.gains) if self.gains else None

    def to_json(self) -> dict[str, Any]:
        m = self.mean
        return {
            "task": self.task,
            "model": self.model,
            "harness": self.harness,
            "harness_scope": self.scope,
            "n": self.n,
            "undefined_g": self.undefined,
            "mean_g": number(m),
            "min_g": number(min(self.gains) if self.gains else None),
            "max_g": number(max(self.gains) if self.gains else None),
            "band": number(self.band),
            "indistinguishable_from_zero": None
            if m is None
            else indistinguishable_from_zero(m, self.band),
            "runs": self.run_ids,
        }


def build_grid(observations: Iterable[Observation]) -> list[Cell]:
    """The cells, sorted by (task, model, harness)."""
    cells: dict[Key, Cell] = {}
    for obs in observations:
        key = (obs.task, obs.model, obs.harness)
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = Cell(obs.task, obs.model, obs.harness, obs.scope, obs.band)
        if obs.g is None:
            cell.undefined += 1
        else:
            cell.gains.append(obs.g)
        if obs.run_id is not None:
            cell.run_ids.append(obs.run_id)
    return [cells[k] for k in sorted(cells)]


def task_bands(observations: Sequence[Observation]) -> tuple[dict[str, Fraction], list[str]]:
    """Each task's band, and a note per task whose runs disagree on it (the largest is
    used: a wider band resolves fewer differences)."""
    seen: dict[str, set[Fraction]] = defaultdict(set)
    for obs in observations:
        seen[obs.task].add(obs.band)
    notes = [
        f"task {task}: runs pin different bands ({', '.join(str(float(b)) for b in sorted(b))}); "
        f"the largest is used"
        for task, b in sorted(seen.items())
        if len(b) > 1
    ]
    return {task: max(b) for task, b in seen.items()}, notes


def cell_means(cells: Iterable[Cell]) -> dict[Key, Fraction]:
    """The mean g of every cell that has one."""
    return {c.key: m for c in cells if (m := c.mean) is not None}
