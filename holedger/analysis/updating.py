"""Harness-updating and harness-benefit as the paper defines them (analyses C3-C5).

A grid holds, for one benchmark, the pass rate J(f, e) of each agent f (a frozen target
model) whose harness evolver e updated, and Base(f) = J(f, H0), the agent's pass rate
with the seed harness (the NONE column). Rates are exact rationals in [0, 1]; ``points``
are 100 times a rate (the paper's % and %p).

* delta(f, e) = J(f, e) - Base(f);
* Delta_updating(e) = the **mean** of delta(f, e) over the anchor agents F*;
* Delta_benefit(f) = the **max** of delta(f, e) over the anchor evolvers E*;
* the evolver spread, max_e - min_e Delta_updating, and the top evolver's breakdown
  delta(f, e_top) for each anchor agent;
* within- against between-agent spread: for each anchor agent the range of J(f, e) over
  the anchor evolvers, against max - min of Base over the anchor agents;
* the extreme pairing: J(strongest anchor, its worst evolver) - J(weakest anchor, its
  best evolver);
* headroom 1 - Base(f) beside Delta_benefit(f);
* regression cells: J(f, e) strictly below Base(f); cells equal to it are ties,
  counted apart.

The anchors default to every agent with a complete row (a Base and a cell for every
evolver) and every evolver with a complete column (a cell for every agent that has a
Base); the output says which anchors were used and how they were chosen. Every reading
the paper leaves open is named in :data:`READINGS` and listed by each grid's output.
Nothing here reads a ledger: these are pure functions of the grid.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

READINGS = {
    "delta": "delta(f, e) = J(f, H^{f,e}) - Base(f), with J the pass rate when f solves and "
    "e evolves (reading, not stated; C3)",
    "formulas": "the paper prints no formulas for the two measures: updating is the mean "
    "over the anchor agents and benefit the max over the anchor evolvers, as its text "
    "says (reading, not stated; C3)",
    "within_between": "within-agent spread is max - min of J(f, e) over the anchor "
    "evolvers, between-agent spread is max - min of Base over the anchor agents, the NONE "
    "column excluded from the first (reading, not stated; C4)",
    "extreme": "the strongest and weakest anchors are those of highest and lowest Base; on "
    "a tie the first by name is taken (reading, not stated; C4)",
    "held_out": "for search runs J(f, e) is the held-out score E(H+) and Base(f) is E(H0), "
    "not an in-situ pass rate; a cell with several runs is their mean (holedger's "
    "reading, not the paper's)",
    "anchors_default": "anchors: every agent with a complete row and every evolver with a "
    "complete column, since the paper's anchors are its own models (holedger's reading)",
    "table": "J and Base read from a published table, as given (nothing verified)",
}

SOURCES = {"in-situ", "held-out", "table"}


@dataclass
class Grid:
    """One benchmark's pass rates: Base per agent and J per (agent, evolver) cell."""

    benchmark: str
    source: str  # "in-situ", "held-out" or "table": one source per grid, never mixed
    base: dict[str, Fraction] = field(default_factory=dict)
    cells: dict[tuple[str, str], Fraction] = field(default_factory=dict)  # (agent, evolver)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown source {self.source!r}")

    @property
    def agents(self) -> list[str]:
        return sorted(set(self.base) | {f for f, _ in self.cells})

    @property
    def evolvers(self) -> list[str]:
        return sorted({e for _, e in self.cells})

    def delta(self, agent: str, evolver: str) -> Fraction | None:
        """delta(f, e) = J(f, e) - Base(f); None when either is missing."""
        j = self.cells.get((agent, evolver))
        base = self.base.get(agent)
        return None if j is None or base is None else j - base


@dataclass(frozen=True)
class Anchors:
    agents: tuple[str, ...]
    evolvers: tuple[str, ...]
    chosen: str  # "default" (complete rows and columns) or "given"


def default_anchors(grid: Grid) -> Anchors:
    """Every agent with a Base and a cell for every evolver; every evolver with a cell for
    every agent that has a Base."""
    evolvers = grid.evolvers
    based = [f for f in grid.agents if f in grid.base]
    agents = tuple(f for f in based if all((f, e) in grid.cells for e in evolvers))
    columns = tuple(e for e in evolvers if based and all((f, e) in grid.cells for f in based))
    return Anchors(agents, columns, "default")


def given_anchors(grid: Grid, agents: Sequence[str], evolvers: Sequence[str]) -> Anchors:
    """Anchors named by the user (empty: the default for that side). A ValueError names
    an anchor the grid does not have."""
    default = default_anchors(grid)
    for name in agents:
        if name not in grid.base:
            raise ValueError(f"anchor agent {name!r} has no Base (NONE) in {grid.benchmark}")
    for name in evolvers:
        if name not in grid.evolvers:
            raise ValueError(f"anchor evolver {name!r} has no cell in {grid.benchmark}")
    return Anchors(
        tuple(sorted(agents)) if agents else default.agents,
        tuple(sorted(evolvers)) if evolvers else default.evolvers,
        "given" if agents or evolvers else "default",
    )


def _mean(values: Sequence[Fraction]) -> Fraction:
    return sum(values, Fraction(0)) / len(values)


def updating(grid: Grid, evolver: str, anchors: Anchors) -> Fraction | None:
    """Delta_updating(e): the mean of delta(f, e) over the anchor agents; None when there
    are none or a cell is missing (a mean over fewer agents is another measure)."""
    values = [grid.delta(f, evolver) for f in anchors.agents]
    if not values or any(v is None for v in values):
        return None
    return _mean([v for v in values if v is not None])


def benefit(grid: Grid, agent: str, anchors: Anchors) -> tuple[Fraction | None, list[str]]:
    """Delta_benefit(f): the max of delta(f, e) over the anchor evolvers, and the evolvers
    reaching it; (None, []) when there are none or a cell is missing."""
    values = {e: grid.delta(agent, e) for e in anchors.evolvers}
    if not values or any(v is None for v in values.values()):
        return None, []
    top = max(v for v in values.values() if v is not None)
    return top, [e for e, v in values.items() if v == top]


def evolver_spread(grid: Grid, anchors: Anchors) -> dict[str, Any]:
    """max - min of Delta_updating over the anchor evolvers, the top evolver(s) and the
    breakdown delta(f, e_top) per anchor agent (of the first top evolver by name)."""
    ups = {e: u for e in anchors.evolvers if (u := updating(grid, e, anchors)) is not None}
    if not ups:
        return {"spread": None, "top": [], "bottom": [], "breakdown": None}
    hi, lo = max(ups.values()), min(ups.values())
    top = sorted(e for e, u in ups.items() if u == hi)
    return {
        "spread": hi - lo,
        "top": top,
        "bottom": sorted(e for e, u in ups.items() if u == lo),
        "breakdown": {
            "evolver": top[0],
            "deltas": [{"agent": f, "delta": grid.delta(f, top[0])} for f in anchors.agents],
        },
    }


def within_between(grid: Grid, anchors: Anchors) -> dict[str, Any]:
    """Per anchor agent, max - min of J(f, e) over the anchor evolvers (NONE excluded),
    against max - min of Base over the anchor agents."""
    within: list[dict[str, Any]] = []
    for f in anchors.agents:
        js = [grid.cells[f, e] for e in anchors.evolvers if (f, e) in grid.cells]
        spread = max(js) - min(js) if js else None
        within.append({"agent": f, "range": spread, "evolvers": len(js)})
    bases = [grid.base[f] for f in anchors.agents]
    return {"within": within, "between": max(bases) - min(bases) if bases else None}


def extreme_pairing(grid: Grid, anchors: Anchors) -> dict[str, Any] | None:
    """J(strongest anchor, its worst evolver) - J(weakest anchor, its best evolver), the
    strongest and weakest by Base (first by name on a tie); None without two anchor agents
    and a complete row for each."""
    if len(anchors.agents) < 2 or not anchors.evolvers:
        return None
    ordered = sorted(anchors.agents, key=lambda f: (-grid.base[f], f))
    strong = ordered[0]
    weak = sorted(anchors.agents, key=lambda f: (grid.base[f], f))[0]
    rows = {}
    for f in (strong, weak):
        row = {e: grid.cells[f, e] for e in anchors.evolvers if (f, e) in grid.cells}
        if len(row) != len(anchors.evolvers):
            return None
        rows[f] = row
    worst = min(rows[strong], key=lambda e: (rows[strong][e], e))
    best = min(rows[weak], key=lambda e: (-rows[weak][e], e))
    return {
        "strongest": strong,
        "worst_evolver": worst,
        "j_strongest_worst": rows[strong][worst],
        "weakest": weak,
        "best_evolver": best,
        "j_weakest_best": rows[weak][best],
        "difference": rows[strong][worst] - rows[weak][best],
    }


def headroom(grid: Grid, anchors: Anchors) -> list[dict[str, Any]]:
    """Per agent with a Base: headroom 1 - Base(f) beside Delta_benefit(f)."""
    out = []
    for f in grid.agents:
        if f not in grid.base:
            continue
        value, best = benefit(grid, f, anchors)
        out.append(
            {
                "agent": f,
                "base": grid.base[f],
                "headroom": 1 - grid.base[f],
                "benefit": value,
                "best_evolvers": best,
            }
        )
    return out


def regressions(grid: Grid) -> dict[str, Any]:
    """Cells strictly below NONE (J(f, e) < Base(f)) and ties (equal), over every cell
    with a Base, counted in total, by agent and by evolver."""
    below: list[tuple[str, str]] = []
    ties: list[tuple[str, str]] = []
    cells = 0
    for (f, e), j in sorted(grid.cells.items()):
        if f not in grid.base:
            continue
        cells += 1
        if j < grid.base[f]:
            below.append((f, e))
        elif j == grid.base[f]:
            ties.append((f, e))

    def count(pairs: Iterable[tuple[str, str]], side: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for pair in pairs:
            out[pair[side]] = out.get(pair[side], 0) + 1
        return dict(sorted(out.items()))

    return {
        "cells": cells,
        "regressions": len(below),
        "ties": len(ties),
        "regression_cells": [{"agent": f, "evolver": e} for f, e in below],
        "tie_cells": [{"agent": f, "evolver": e} for f, e in ties],
        "regressions_by_agent": count(below, 0),
        "regressions_by_evolver": count(below, 1),
        "ties_by_agent": count(ties, 0),
        "ties_by_evolver": count(ties, 1),
    }


def readings_of(grid: Grid, anchors: Anchors) -> list[str]:
    """The readings a grid's output depends on, in words."""
    keys = ["delta", "formulas", "within_between", "extreme"]
    if anchors.chosen == "default":
        keys.append("anchors_default")
    if grid.source == "held-out":
        keys.append("held_out")
    if grid.source == "table":
        keys.append("table")
    return [READINGS[k] for k in keys]


def analyse(grid: Grid, anchors: Anchors | None = None) -> dict[str, Any]:
    """Every measure of one grid, quantities as Fractions (JSON gives each its pair)."""
    anchors = anchors or default_anchors(grid)
    return {
        "benchmark": grid.benchmark,
        "source": grid.source,
        "anchors": {
            "agents": list(anchors.agents),
            "evolvers": list(anchors.evolvers),
            "chosen": anchors.chosen,
        },
        "agents": grid.agents,
        "evolvers": grid.evolvers,
        "base": [{"agent": f, "base": grid.base[f]} for f in grid.agents if f in grid.base],
        "cells": [
            {"agent": f, "evolver": e, "j": j, "delta": grid.delta(f, e)}
            for (f, e), j in sorted(grid.cells.items())
        ],
        "updating": [
            {"evolver": e, "updating": updating(grid, e, anchors), "anchor": e in anchors.evolvers}
            for e in grid.evolvers
        ],
        "benefit": [
            {"agent": f, "benefit": value, "best_evolvers": best}
            for f in grid.agents
            if f in grid.base
            for value, best in [benefit(grid, f, anchors)]
        ],
        "evolver_spread": evolver_spread(grid, anchors),
        "within_between": within_between(grid, anchors),
        "extreme_pairing": extreme_pairing(grid, anchors),
        "headroom": headroom(grid, anchors),
        "regressions": regressions(grid),
        "readings": readings_of(grid, anchors),
    }


def across_benchmarks(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over several grids: the top evolvers of each, whether one evolver tops every
    benchmark, and the regression counts summed by evolver and by agent."""
    tops = {r["benchmark"]: r["evolver_spread"]["top"] for r in results}
    common: set[str] | None = None
    for top in tops.values():
        common = set(top) if common is None else common & set(top)
    by_evolver: dict[str, int] = {}
    by_agent: dict[str, int] = {}
    for r in results:
        for e, n in r["regressions"]["regressions_by_evolver"].items():
            by_evolver[e] = by_evolver.get(e, 0) + n
        for f, n in r["regressions"]["regressions_by_agent"].items():
            by_agent[f] = by_agent.get(f, 0) + n
    return {
        "top_by_benchmark": tops,
        "wins_every_benchmark": sorted(common or ()) if len(tops) > 1 else [],
        "regressions_by_benchmark": {
            r["benchmark"]: r["regressions"]["regressions"] for r in results
        },
        "regressions_by_evolver": dict(sorted(by_evolver.items())),
        "regressions_by_agent": dict(sorted(by_agent.items())),
    }
