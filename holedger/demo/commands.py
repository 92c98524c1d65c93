"""`holedger demo` and `holedger report RUN`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from holedger.output import console, emit_json, plain, progress_bar, settings
from holedger.sandboxes import BACKEND_NAMES
from holedger.server.descriptor_options import descriptor_from, descriptor_options


@click.command("report")
@click.argument("run")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the page (default: HOME/reports/RUN_ID.html).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def report_cmd(ctx: click.Context, run: str, output: Path | None, as_json: bool) -> None:
    """Write a self-contained HTML report of RUN: verdict, budget, candidates, scores, safety.

    The page loads nothing from anywhere (inline CSS and SVG, no script). Exit 0 when the
    run verifies, 1 when it does not (the page is written either way).
    """
    from holedger.demo.report import render_run_report

    cfg = settings(ctx)
    with progress_bar("checking events") as progress:
        result = render_run_report(cfg, run, output, progress)
    if as_json:
        emit_json(
            {
                "run_id": result.run_id,
                "report": str(result.path),
                "verified": result.verified,
                "verdict": result.report.verdict,
            }
        )
    else:
        state = (
            "[bold red]FAILED verification[/]"
            if not result.verified
            else "[yellow]verified (aborted)[/]"
            if result.report.aborted
            else "[green]verified[/]"
        )
        console().print(
            f"run {result.run_id}: {state}; report written to {plain(result.path)}",
            soft_wrap=True,  # the path must copy whole
        )
    sys.exit(0 if result.verified else 1)


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end.")
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    default=None,
    help="Sandbox backend (default: the strongest available).",
)
@click.option(
    "--shortcuts",
    is_flag=True,
    help="Let the example optimizer also pick the task's overfitting shortcut (a lookup "
    "table of dev answers), for an audit to find: 'holedger audit --help'.",
)
@click.option(
    "--task",
    default=None,
    help="A task name or folder to run the demo on (default: the bundled officeqa-lite); "
    "its prepared edits, if any, are in the folder 'edits' beside its seed.",
)
@click.option(
    "--protocol",
    type=click.Choice(["search", "solve-evolve"]),
    default="search",
    show_default=True,
    help="search: the example optimizer searches and nominates; solve-evolve: its evolver "
    "edits the harness between batches of a dev stream, each scored in situ.",
)
@click.option(
    "--batch",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="solve-evolve: cases per step.",
)
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=None,
    help="solve-evolve: steps (default: every whole batch of the dev split).",
)
@click.option(
    "--executor",
    default=None,
    help="Where trials run: local, or ray://HEAD:PORT, a Ray cluster (default: "
    "HOLEDGER_EXECUTOR, else local; docs/SCALING.md).",
)
@descriptor_options
@click.pass_context
def demo_cmd(
    ctx: click.Context,
    as_json: bool,
    backend: str | None,
    shortcuts: bool,
    task: str | None,
    protocol: str,
    batch: int,
    steps: int | None,
    executor: str | None,
    opt_model: str | None,
    opt_family: str | None,
    opt_release: str | None,
    opt_harness: str | None,
    opt_scope: str | None,
    opt_replicate: int | None,
) -> None:
    """Run a complete, offline, verified optimization run on the bundled task and show it.

    Creates the home if needed, pins the seed baseline (first time only), opens a run,
    runs the example optimizer in its own sandbox against the optimizer API, scores the
    nominated candidate on the held-out split, closes, replays and writes an HTML report.
    Exit 0 when the run verifies and its gain is resolved (A5: g > b, the demo's success
    criterion; |g| <= b is indistinguishable from 0), 1 otherwise; 130 when interrupted
    (Ctrl-C), after recording what ran and closing the run as aborted.
    --model and --harness (and the other descriptor options) sign who ran the search.
    --protocol solve-evolve runs the task as a solve-evolve run instead (its dev stream in
    batches, the example evolver's one edit or none per step, J against its NONE run);
    exit 0 when it verifies.
    """
    from holedger.demo.run import DEMO_TASK, run_demo

    descriptor = descriptor_from(
        opt_model, opt_family, opt_release, opt_harness, opt_scope, opt_replicate
    )
    cfg = settings(ctx)
    if protocol == "solve-evolve":
        from holedger.demo.evolve_run import run_evolve_demo

        evolved = run_evolve_demo(
            cfg,
            backend=backend,
            as_json=as_json,
            task=task or DEMO_TASK,
            batch=batch,
            steps=steps,
            descriptor=descriptor,
        )
        if as_json:
            emit_json(evolved.to_json())
        sys.exit(0 if evolved.ok else 1)
    summary = run_demo(
        cfg,
        backend=backend,
        as_json=as_json,
        descriptor=descriptor,
        shortcuts=shortcuts,
        task=task or DEMO_TASK,
        executor=executor,
    )
    if as_json:
        emit_json(summary.to_json())
    sys.exit(0 if summary.ok else 1)


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    from holedger.demo.campaign_commands import campaign_group

    cli.add_command(demo_cmd)
    cli.add_command(report_cmd)
    cli.add_command(campaign_group)
