"""The grids of :mod:`holedger.analysis.updating`, built from scored search runs or read
from a published table.

From runs (one source: held-out gains), each task is a benchmark, each optimizer label an
evolver, and each agent a (target models, task digest) pair as in
:mod:`holedger.analysis.capabilities`: J(f, e) is the mean held-out score E(H+) of e's
runs on f, and Base(f) is E(H0), the seed's pinned score. An agent whose runs pinned more
than one E(H0) has no single Base and is left out, named.

The table (``--table CSV``) is long: one row per cell, columns ``agent``, ``evolver``,
``j`` (a pass rate in [0, 1], a decimal or p/q) and optionally ``benchmark`` (default
``table``). The evolver ``NONE`` gives the agent's Base. Nothing read from it is verified.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from holedger.analysis.capabilities import agent_label, capabilities
from holedger.analysis.csvtable import read_table, table_number
from holedger.analysis.gains import RunGain
from holedger.analysis.updating import Grid
from holedger.errors import UsageError

NONE = "NONE"


def grids_from_gains(gains: Iterable[RunGain]) -> tuple[list[Grid], list[tuple[str, str]]]:
    """One held-out grid per task, and the agents left out (label, why)."""
    grids: list[Grid] = []
    left: list[tuple[str, str]] = []
    for table in capabilities(gains):
        grid = Grid(table.task_id, "held-out")
        for agent in table.agents:
            label = agent_label(agent)
            runs = [r for (_, a), rs in table.cells.items() if a == agent for r in rs]
            bases = sorted({r.e_h0 for r in runs})
            if len(bases) != 1:
                values = ", ".join(str(b) for b in bases)
                left.append(
                    (f"{table.task_id}: {label}", f"its runs pinned {len(bases)} E(H0): {values}")
                )
                continue
            grid.base[label] = bases[0]
            for optimizer in table.optimizers:
                cell = table.cells.get((optimizer, agent))
                if cell:
                    grid.cells[label, optimizer] = sum(
                        (r.e_h_plus for r in cell), Fraction(0)
                    ) / len(cell)
        grids.append(grid)
    return grids, left


def grids_from_table(path: str) -> list[Grid]:
    """Read a long table of cells; a UsageError naming the row and column for bad input."""
    name, _, rows = read_table(
        path,
        ("agent", "evolver", "j"),
        "columns: [benchmark,] agent, evolver (NONE for the base), j",
    )
    grids: dict[str, Grid] = {}
    seen: dict[tuple[str, str, str], int] = {}
    for line, cells in rows:
        bench = cells.get("benchmark") or "table"
        agent, evolver, text = cells["agent"], cells["evolver"], cells["j"]
        if not agent or not evolver:
            raise UsageError(f"table {name} row {line}: empty agent or evolver")
        j = table_number(name, line, "j", text)
        if not 0 <= j <= 1:
            raise UsageError(
                f"table {name} row {line}, column 'j': {text} is not a pass rate in [0, 1]",
                hint="give a percentage divided by 100",
            )
        key = (bench, agent, evolver)
        if key in seen:
            raise UsageError(
                f"table {name} row {line}: a second cell for agent {agent!r} and evolver "
                f"{evolver!r} in {bench!r} (first at row {seen[key]})"
            )
        seen[key] = line
        grid = grids.setdefault(bench, Grid(bench, "table"))
        if evolver == NONE:
            grid.base[agent] = j
        else:
            grid.cells[agent, evolver] = j
    if not grids:
        raise UsageError(f"table {name}: no cells")
    return [grids[b] for b in sorted(grids)]
