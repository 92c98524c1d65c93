"""The grids of :mod:`holedger.analysis.updating` from solve-evolve runs: in-situ pass rates.

Each closed, completed solve-evolve run (``RunOpened.solve_evolve``, an InSituScored) is one
cell: the benchmark is the task and its stream (task id and the stream digest's first
characters: runs of other streams are other grids), the agent is (target models, task
digest) as in :mod:`holedger.analysis.capabilities`, the evolver is the run's optimizer
label, J(f, e) is the run's in-situ pass rate J (the mean of the cell's runs when there are
several) and Base(f) is the J of the stream's pinned NONE run. NONE runs themselves, runs
with no NONE run pinned, aborted and unclosed runs are left out, each named with why; with
``verify`` every run (and, through the ``none_run`` check, its NONE run) is replayed first
and left out unless it verifies. Held-out gains of search runs never enter these grids.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from holedger.analysis.capabilities import agent_label
from holedger.analysis.updating import Grid
from holedger.ledger.keys import PublicKey
from holedger.protocol import evolve
from holedger.schemas.events import InSituScored, RunClosed

SOURCE_DETAIL = (
    "in-situ pass rates of solve-evolve runs: J = the run's InSituScored J (each case scored "
    "under the harness before its step), Base = the J of the stream's pinned NONE run"
)


def grids_from_ledger(
    ledger: Any,
    *,
    task_id: str | None = None,
    verify: bool = False,
    trusted_keys: Sequence[PublicKey] = (),
) -> tuple[list[Grid], list[tuple[str, str]], int]:
    """In-situ grids of the ledger's solve-evolve runs, the runs left out (run, why), and
    how many runs entered the grids."""
    left: list[tuple[str, str]] = []
    cells: dict[tuple[str, str, str], list[Fraction]] = {}
    bases: dict[tuple[str, str], set[Fraction]] = {}
    used = 0
    for run_id in ledger.run_ids():
        opened = ledger.run_terms(run_id)
        terms = opened.solve_evolve
        if terms is None or (task_id and opened.task_id != task_id):
            continue
        if opened.optimizer == evolve.NONE_OPTIMIZER:
            continue  # a Base, read through the runs that pin it
        scored, closed = _ends(ledger, run_id)
        why = None
        if closed is None:
            why = "not closed"
        elif closed.reason != "completed" or scored is None:
            why = f"closed as {closed.reason} with no in-situ score"
        elif terms.none_run is None or scored.base is None:
            why = "pins no NONE run, so has no Base"
        elif verify and not _verifies(ledger, run_id, trusted_keys):
            why = "does not verify (see 'holedger replay RUN')"
        if why is not None:
            left.append((run_id, why))
            continue
        assert scored is not None and scored.base is not None
        bench = f"{opened.task_id} [{terms.stream_digest[:8]}]"
        agent = agent_label((tuple(sorted(opened.terms.models)), opened.task_digest))
        cells.setdefault((bench, agent, opened.optimizer), []).append(scored.j)
        bases.setdefault((bench, agent), set()).add(scored.base)
        used += 1
    grids: dict[str, Grid] = {}
    for (bench, agent, evolver), js in sorted(cells.items()):
        grid = grids.setdefault(bench, Grid(bench, "in-situ"))
        base = bases[bench, agent]
        if len(base) != 1:
            continue  # named below, once per agent
        grid.base[agent] = next(iter(base))
        grid.cells[agent, evolver] = sum(js, Fraction(0)) / len(js)
    for (bench, agent), base in sorted(bases.items()):
        if len(base) != 1:
            left.append((f"{bench}: {agent}", f"its runs pinned {len(base)} different Base"))
    return [grids[b] for b in sorted(grids)], left, used


def _ends(ledger: Any, run_id: str) -> tuple[InSituScored | None, RunClosed | None]:
    scored = closed = None
    for rec in ledger.records(run_id):
        if rec.type == "InSituScored" and scored is None:
            scored = InSituScored.model_validate(rec.payload)
        elif rec.type == "RunClosed":
            closed = RunClosed.model_validate(rec.payload)
    return scored, closed


def _verifies(ledger: Any, run_id: str, trusted_keys: Sequence[PublicKey]) -> bool:
    from holedger.replay.runs import replay_run

    return bool(replay_run(ledger, run_id, trusted_keys=list(trusted_keys)).verified)
