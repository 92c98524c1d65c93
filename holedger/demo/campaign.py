"""`holedger campaign run GRID.toml`: a grid of runs against one ledger, resumable.

Each cell of the grid (demo/grid.py) is one run of the example optimizer, configured by
the cell's arguments, in its own sandbox, against the trusted server's API, as
`holedger demo` runs it. Up to ``concurrency`` runs go at a time; their trials share the
server's pool of ``workers`` (on this machine, or on a Ray cluster: ``executor``).

Resuming. A cell's run is found in the ledger by what RunOpened signs: the task, the
optimizer descriptor (model, harness, scope, replicate) and the campaign's label. So a
campaign started again after a kill:

* skips every cell with a completed run (closed with a score);
* finishes a run whose held-out scoring was cut short (nominated, not closed) by
  nominating the same candidate again, as the server documents;
* records what a run cut short during its search left (as `holedger run recover` does),
  closes it as aborted (it verifies as "VERIFIED (aborted)"), and runs the cell again in
  a new run: the example optimizer keeps its search state in its own process only.

No run and no trial is recorded twice: a cell has at most one completed run, and a run
cut short is closed before its cell runs again. At the end, the campaign writes the
analysis report of its completed runs and prints the command that replays every run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import shlex
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holedger.config import Settings
from holedger.demo.campaign_tasks import task_refs
from holedger.demo.grid import Cell, Grid, descriptor_of
from holedger.demo.optimizer_log import save_optimizer_log
from holedger.demo.sandboxed import (
    PrivateServer,
    RunFollower,
    choose_backend,
    optimizer_spec,
    prepare_optimizer_dir,
    private_server,
)
from holedger.errors import HoledgerError, NotFoundError, UsageError
from holedger.ledger.store import Ledger
from holedger.sandboxes.spec import Backend

ABORT_WHY = "the campaign was cut short during this run's search; its cell runs again"
POLL_S = 0.5


@dataclass
class CellResult:
    cell: Cell
    run_id: str | None
    state: str  # "completed" (closed with a score), "aborted", "failed"
    seconds: float = 0.0
    resumed: str | None = None  # "skipped" (done before), "finished" (nominated before)
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        c = self.cell
        return {
            "task": c.task,
            "model": c.model,
            "harness": c.harness,
            "scope": c.scope,
            "replicate": c.replicate,
            "run_id": self.run_id,
            "state": self.state,
            "resumed": self.resumed,
            "detail": self.detail,
        }


@dataclass
class CampaignSummary:
    grid: Grid
    results: list[CellResult]
    aborted: list[str]  # runs cut short and closed as aborted by this resume
    report: Path | None
    verify_command: str
    seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.state == "completed" for r in self.results)

    def as_json(self) -> dict[str, Any]:
        return {
            "campaign": self.grid.name,
            "cells": len(self.grid.cells),
            "completed": sum(r.state == "completed" for r in self.results),
            "runs": [r.as_json() for r in self.results],
            "aborted_runs": self.aborted,
            "report": None if self.report is None else str(self.report),
            "verify_command": self.verify_command,
            "seconds": round(self.seconds, 1),
            "problems": self.problems,
        }


def cell_runs(
    ledger: Ledger, grid: Grid, task_ids: dict[str, str]
) -> dict[tuple[Any, ...], list[Any]]:
    """The campaign's runs in the ledger by cell key (from their signed RunOpened)."""
    by_task_id = {tid: ref for ref, tid in task_ids.items()}
    found: dict[tuple[Any, ...], list[Any]] = {}
    for info in ledger.runs():
        if info.optimizer != grid.label:
            continue
        opened = ledger.run_terms(info.run_id)
        d = opened.descriptor
        if d is None or opened.task_id not in by_task_id:
            continue
        key = (by_task_id[opened.task_id], d.model, d.harness, d.harness_scope, d.replicate)
        found.setdefault(key, []).append(info)
    return found


@contextlib.contextmanager
def campaign_lock(cfg: Settings, grid: Grid) -> Iterator[None]:
    """One process per campaign and home: a second one is refused at once."""
    folder = cfg.home / "campaigns"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{grid.name}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"campaign {grid.name} is already running on this home",
                hint="wait for it, or stop it; a stopped campaign resumes when run again",
            ) from None
        yield


def check_grid(grid: Grid, loads: dict[str, str] | None = None) -> dict[str, str]:
    """Every task of the grid loads (task ref -> task id; ``loads``: what to load for
    each ref, when not the ref itself); nothing is made or recorded before."""
    from holedger.server.taskview import load_server_task

    ids: dict[str, str] = {}
    for ref in grid.tasks:
        try:
            terms = load_server_task((loads or {}).get(ref, ref)).terms
        except NotFoundError as exc:
            raise UsageError(
                f"grid {grid.name}: unknown task {ref!r} ({exc.message})",
                hint="give a bundled task's name or a task folder",
            ) from None
        ids[ref] = terms.task_id
        size = terms.split_sizes.get("test", 0)
        if grid.test_cases is not None and grid.test_cases > size:
            raise UsageError(
                f"grid {grid.name}: test_cases = {grid.test_cases}, but task {ref!r} has "
                f"{size} test cases",
                hint=f"give at most {size}",
            )
    if len(set(ids.values())) != len(ids):
        raise UsageError(f"grid {grid.name}: two tasks of the grid are the same task")
    return ids


def run_campaign(
    cfg: Settings,
    grid: Grid,
    *,
    say: Callable[[str], None],
    executor: str | None = None,
    progress: Any = None,
) -> CampaignSummary:
    """Run (or resume) every cell of ``grid``; see the module's doc."""
    started = time.monotonic()
    check_grid(grid)
    if executor:  # an unreachable cluster, or one with no trial node: refused before all
        from holedger.server.executor import make_executor

        make_executor(executor).close()
    chosen = choose_backend(grid.backend, say)
    if not cfg.key_path.exists():
        Ledger.init_home(cfg)
        say(f"created the home {cfg.home}")
    loads = task_refs(cfg, grid.tasks, grid.test_cases)
    task_ids = check_grid(grid, loads)
    with campaign_lock(cfg, grid):
        options: dict[str, Any] = {"workers": grid.workers, "backend": chosen.name}
        if executor:
            options["executor"] = executor
        with private_server(cfg, prefix="holedger-campaign-", **options) as room:
            return _run(cfg, grid, loads, task_ids, room, chosen, say, progress, started)


def _run(
    cfg: Settings,
    grid: Grid,
    loads: dict[str, str],
    task_ids: dict[str, str],
    room: PrivateServer,
    backend: Backend,
    say: Callable[[str], None],
    progress: Any,
    started: float,
) -> CampaignSummary:
    from holedger.server.lifecycle import abort_run

    service = room.server.service
    reader = room.reader
    for ref in grid.tasks:
        baseline = service.ensure_baseline(loads[ref], backend=backend.name)
        say(f"{task_ids[ref]}: seed baseline E(H0) = {float(baseline.e_h0):.3f} (pinned)")
    existing = cell_runs(reader, grid, task_ids)
    results: dict[tuple[Any, ...], CellResult] = {}
    aborted: list[str] = []
    finish: list[tuple[Cell, str, str]] = []
    todo: list[Cell] = []
    for cell in grid.cells:
        infos = existing.get(cell.key, [])
        done = [i for i in infos if i.state == "closed"]
        if done:
            results[cell.key] = CellResult(cell, done[0].run_id, "completed", resumed="skipped")
            continue
        open_runs = [i for i in infos if i.state == "open"]
        redo = True
        for info in open_runs:
            service.recover(info.run_id)  # what a stopped server left, as `run recover`
            state = service.state(info.run_id)
            if state.nominated is not None and not state.closed and redo:
                finish.append((cell, info.run_id, state.nominated))
                redo = False
            elif not state.closed:
                abort_run(service, info.run_id, ABORT_WHY)
                aborted.append(info.run_id)
        if redo:
            todo.append(cell)
    total = len(grid.cells)
    already = len(results)
    if already or aborted or finish:
        say(
            f"campaign {grid.name}: resuming: {already} of {total} runs done before, "
            f"{len(finish)} to finish, {len(aborted)} cut short closed as aborted"
        )
    say(
        f"campaign {grid.name}: {len(todo) + len(finish)} runs to go, {grid.concurrency} at "
        f"a time, sandbox {backend.name}"
    )
    board = Board(reader, total, already, say, progress)
    opt_root = room.folder / "optimizers"
    opt_root.mkdir()

    def run_cell(cell: Cell) -> CellResult:
        task = loads[cell.task]
        return _run_cell(cfg, service, backend, cell, task, grid, opt_root, room.sockets, board)

    def finish_cell(cell: Cell, run_id: str, nominee: str) -> CellResult:
        t0 = time.monotonic()
        board.start(cell, run_id)
        try:
            service.nominate(run_id, nominee)
            result = CellResult(cell, run_id, "completed", time.monotonic() - t0, "finished")
        except HoledgerError as exc:
            result = CellResult(cell, run_id, "failed", detail=exc.one_line())
        board.end(result)
        return result

    with concurrent.futures.ThreadPoolExecutor(grid.concurrency, "campaign") as pool:
        futures = [pool.submit(finish_cell, *item) for item in finish]
        futures += [pool.submit(run_cell, cell) for cell in todo]
        try:
            while not all(f.done() for f in futures):
                board.tick()
                concurrent.futures.wait(futures, timeout=POLL_S)
        finally:
            board.close()
        for future in futures:
            result = future.result()
            results[result.cell.key] = result
    ordered = [results[c.key] for c in grid.cells]
    problems = [f"{r.cell.name}: {r.state}: {r.detail}" for r in ordered if r.state != "completed"]
    done = [r.run_id for r in ordered if r.state == "completed"]
    roots = {task_ids[ref]: Path(loads[ref]) for ref in grid.tasks if loads[ref] != ref}
    report = write_grid_report(cfg, done, grid, roots)
    return CampaignSummary(
        grid,
        ordered,
        aborted,
        report,
        verify_command(cfg, grid),
        time.monotonic() - started,
        problems,
    )


def _run_cell(
    cfg: Settings,
    service: Any,
    backend: Backend,
    cell: Cell,
    task_ref: str,
    grid: Grid,
    opt_root: Path,
    sockets: tuple[Path, Path],
    board: Board,
) -> CellResult:
    from holedger.server.lifecycle import abort_run

    t0 = time.monotonic()
    task = service.task(task_ref)
    opened = service.open_run(
        task_ref, optimizer=grid.label, backend=backend.name, descriptor=descriptor_of(cell)
    )
    run_id = opened.run_id
    board.start(cell, run_id)
    folder = opt_root / run_id
    folder.mkdir()
    opt_dir = prepare_optimizer_dir(folder, task.seed_dir.parent / "edits")
    spec = optimizer_spec(opt_dir, run_id, opened.optimizer_token, sockets, cell.args)
    try:
        result = backend.run(spec)
        save_optimizer_log(cfg, run_id, result)
        state = service.state(run_id)
        if state.closed:
            outcome = CellResult(cell, run_id, "completed", time.monotonic() - t0)
        else:
            why = "timed out" if result.timed_out else f"exited with status {result.exit_status}"
            tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
            detail = f"the optimizer {why} without nominating: {' '.join(tail)}"
            abort_run(service, run_id, detail[:400])
            outcome = CellResult(cell, run_id, "aborted", time.monotonic() - t0, detail=detail)
    except HoledgerError as exc:
        outcome = CellResult(cell, run_id, "failed", time.monotonic() - t0, detail=exc.one_line())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    board.end(outcome)
    return outcome


class Board:
    """Progress per run (trials recorded so far) and overall (runs done of the grid): a
    live display on a terminal (``progress``, a rich Progress), else one line per event."""

    def __init__(
        self, reader: Ledger, total: int, done: int, say: Callable[[str], None], progress: Any
    ) -> None:
        self.follower = RunFollower(reader)
        self.total = total
        self.done = done
        self.say = say
        self.progress = progress
        self.lock = threading.Lock()
        self.bars: dict[str, Any] = {}
        self.overall = None
        if progress is not None:
            self.overall = progress.add_task("campaign: runs done", total=total, completed=done)

    def start(self, cell: Cell, run_id: str) -> None:
        with self.lock:
            if self.progress is not None:
                self.bars[run_id] = self.progress.add_task(f"{cell.name} trials", total=None)
            else:
                self.say(f"started  {cell.name} ({cell.scope}): run {run_id}")

    def end(self, result: CellResult) -> None:
        with self.lock:
            self.done += 1
            rid = result.run_id or "-"
            if self.progress is not None:
                bar = self.bars.pop(rid, None)
                if bar is not None:
                    self.progress.remove_task(bar)
                self.progress.update(self.overall, completed=self.done)
            self.say(
                f"[{self.done}/{self.total}] {result.state:<9} {result.cell.name} "
                f"({result.cell.scope}): run {rid} {result.detail}".rstrip()
            )

    def tick(self) -> None:
        if self.progress is None:
            return
        with self.lock:
            for run_id, bar in list(self.bars.items()):
                with contextlib.suppress(Exception):  # progress never breaks a campaign
                    counts = self.follower.poll(run_id)
                    trials = counts.get("TrialCompleted", 0) + counts.get("HeldOutTrial", 0)
                    self.progress.update(bar, completed=trials)

    def close(self) -> None:
        self.tick()


def write_grid_report(
    cfg: Settings,
    run_ids: list[str | None],
    grid: Grid,
    task_roots: dict[str, Path] | None = None,
) -> Path | None:
    """The analysis report of the campaign's completed runs (HOME/reports/);
    ``task_roots``: the folders of the campaign's copies of tasks, by task id."""
    from holedger.analysis.report import render_report
    from holedger.analysis.sources import from_runs

    wanted = {r for r in run_ids if r}
    if not wanted:
        return None
    source = from_runs(ledger_url=cfg.ledger_url, runs_dir=cfg.runs_dir, verify=False)
    source.observations = [o for o in source.observations if o.run_id in wanted]
    source.facts = {r: f for r, f in source.facts.items() if r in wanted}
    source.left_out = [(r, why) for r, why in source.left_out if r in wanted]
    source.task_roots.update(task_roots or {})
    path = cfg.reports_dir / f"campaign-{grid.name}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    render_report(source, path)
    return path


def verify_command(cfg: Settings, grid: Grid) -> str:
    parts = ["holedger"]
    if cfg.home != Settings.resolve(".holedger").home:
        parts += ["--home", shlex.quote(str(cfg.home))]
    if cfg.ledger_url != Settings.resolve(cfg.home).ledger_url:
        parts += ["--ledger", shlex.quote(cfg.ledger_url)]
    parts += ["campaign", "verify"]
    if grid.source is None:
        parts.append("--example")
    else:
        parts.append(shlex.quote(str(grid.source)))
    return " ".join(parts)
