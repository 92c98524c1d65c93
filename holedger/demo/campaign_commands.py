"""`holedger campaign run|verify`: a grid of runs (demo/campaign.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from holedger.errors import UsageError
from holedger.output import console, emit_json, plain, settings


def _grid(path: Path | None, example: bool) -> object:
    from holedger.demo.grid import EXAMPLE_GRID, load_grid

    if example == (path is not None):
        raise UsageError("give a GRID.toml or --example (one of them)")
    grid = load_grid(EXAMPLE_GRID if path is None else path)
    if example:
        grid.source = None
    return grid


@click.group("campaign")
def campaign_group() -> None:
    """Grids of runs (tasks × optimizer configurations × replicates) against one ledger."""


@campaign_group.command("run")
@click.argument("grid_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--example",
    is_flag=True,
    help="Run the bundled offline grid: 3 configurations of the example optimizer, in a "
    "common and a native harness, 2 replicates (12 runs, about 860 trials; measured: about "
    "6 minutes on 2 idle cores, 10 to 14 CPU-minutes, longer on a busy machine).",
)
@click.option(
    "--executor",
    default=None,
    help="Where trials run: 'local' or ray://HEAD:PORT (default: the grid's executor).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end.")
@click.pass_context
def run_cmd(
    ctx: click.Context, grid_file: Path | None, example: bool, executor: str | None, as_json: bool
) -> None:
    """Run every run of a grid not yet completed; a stopped campaign resumes where it was.

    Completed runs are not run again; a run cut short during its held-out scoring is
    finished; one cut short during its search is closed as aborted and its cell runs
    again. At the end: the analysis report of the grid, and the command that replays every
    run. Exit 0 when every run completed, 1 otherwise.
    """
    from holedger.demo.campaign import run_campaign
    from holedger.demo.grid import Grid

    grid = _grid(grid_file, example)
    assert isinstance(grid, Grid)
    chosen = executor or grid.executor
    if chosen != "local" and not chosen.startswith("ray://"):
        raise UsageError(f"unknown executor {chosen!r}", hint="local or ray://HEAD:PORT")
    cfg = settings(ctx)
    err = console(stderr=True)

    def say(text: str) -> None:
        err.print(plain(text), soft_wrap=True, highlight=False)

    if example:
        say(
            f"campaign {grid.name}: {len(grid.cells)} runs of the example optimizer on the "
            f"bundled task, offline, held-out scoring on {grid.test_cases} of its test cases: "
            "about 860 trials (each a Python that imports the openai SDK), measured at 5.3 "
            "minutes on 2 idle cores (10 to 14 CPU-minutes), under 15 minutes; longer on a "
            "busy machine (benchmarks/RESULTS.md, 'Campaigns')"
        )
    progress = None
    if err.is_terminal and not as_json:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        progress = Progress(
            TextColumn("{task.description:<48}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        )
    with progress if progress is not None else _null():
        summary = run_campaign(
            cfg, grid, say=say, executor=None if chosen == "local" else chosen, progress=progress
        )
    if as_json:
        emit_json(summary.as_json())
    else:
        out = console()
        done = sum(r.state == "completed" for r in summary.results)
        out.print(
            f"campaign {grid.name}: {done} of {len(summary.results)} runs completed "
            f"in {summary.seconds:.0f} s",
            soft_wrap=True,
        )
        for problem in summary.problems:
            out.print(f"problem: {plain(problem)}", soft_wrap=True, highlight=False)
        if summary.report is not None:
            out.print(f"grid report     {plain(summary.report)}", soft_wrap=True)
        out.print(f"verify every run: {plain(summary.verify_command)}", soft_wrap=True)
    sys.exit(0 if summary.ok else 1)


@campaign_group.command("verify")
@click.argument("grid_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--example", is_flag=True, help="The bundled offline grid.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def verify_cmd(ctx: click.Context, grid_file: Path | None, example: bool, as_json: bool) -> None:
    """Replay every run the campaign recorded (completed, and cut short then aborted).

    Exit 0 when every run verifies and every cell of the grid has a completed run."""
    from holedger.demo.campaign_verify import verify_campaign
    from holedger.demo.grid import Grid

    grid = _grid(grid_file, example)
    assert isinstance(grid, Grid)
    result = verify_campaign(settings(ctx), grid)
    if as_json:
        emit_json(result.as_json())
    else:
        out = console()
        for row in result.rows:
            out.print("\t".join(str(v) for v in row), soft_wrap=True, highlight=False)
        for line in result.problems:
            out.print(f"problem: {plain(line)}", soft_wrap=True, highlight=False)
        out.print(result.headline(), soft_wrap=True)
    sys.exit(0 if result.ok else 1)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
