"""`holedger analysis gains` (normalized gains of scored runs against resolution bands) and
`holedger analysis capabilities` (harness-updating per optimizer, harness-benefit per
target model)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from holedger.analysis.group import BUNDLES, JSON, TASK, TRUSTED, analysis_group
from holedger.errors import UsageError
from holedger.numbers import decimal
from holedger.output import console, emit_json, plain, settings, table
from holedger.replay.options import with_options
from holedger.replay.report import counted

if TYPE_CHECKING:
    from holedger.analysis.gains import RunGain


# The options of gains and capabilities: which runs, from where, replayed or not.
_run_sources = with_options(
    TASK,
    click.option("--verify", is_flag=True, help="Replay each run; count only verified runs."),
    TRUSTED,
    BUNDLES,
)


def _collect(
    ctx: click.Context,
    task_id: str | None,
    verify: bool,
    trusted: tuple[str, ...],
    bundles: tuple[str, ...],
    baselines: bool = False,
) -> tuple[list[RunGain], list[str], str, list[str]]:
    """The scored runs the options name, the ids left out (not verified), a note on how
    they were read, and the aborted runs left out (no score)."""
    from holedger.analysis.gains import gather
    from holedger.ledger.keys import load_trusted_keys
    from holedger.ledger.store import Ledger
    from holedger.protocol.rules import RESCORE_OPTIMIZER

    if trusted and not verify:
        raise UsageError("--trusted-key pins the keys of --verify", hint="add --verify")
    keys = load_trusted_keys(list(trusted))
    excluded: list[str] = []
    no_baseline: list[str] = []
    aborted: list[str] = []
    ledger = None if bundles else Ledger.open(settings(ctx).ledger_url, None, create_tables=False)
    try:
        gains = gather(
            ledger=ledger,
            bundles=bundles,
            task_id=task_id,
            include_baselines=baselines,
            verify=verify,
            excluded=excluded,
            trusted_keys=keys,
            no_baseline=no_baseline,
            aborted=aborted,
        )
    finally:
        if ledger is not None:
            ledger.close()
    gains = [g for g in gains if g.optimizer != RESCORE_OPTIMIZER]  # see analysis bands
    if verify:
        see = "holedger verify BUNDLE" if bundles else "holedger replay RUN"
        parts = []
        if excluded:
            parts.append(
                f"{counted(len(excluded), 'scored run')} left out: replay does not verify "
                f"{', '.join(r[:8] for r in excluded)} (see '{see}')"
            )
        if no_baseline:
            parts.append(
                f"{counted(len(no_baseline), 'scored run')} left out: the bundle of the "
                f"seed-baseline run its E(H0) is pinned to was not given "
                f"({', '.join(r[:8] for r in no_baseline)}; add it with --bundle)"
            )
            excluded += no_baseline
        note = "; ".join(parts) or "every scored run verifies"
        if not keys:
            note += " (under the keys each run declares: pin them with --trusted-key)"
    else:
        note = "not replayed: --verify counts only the runs that verify"
    if aborted:
        note += (
            f"; {counted(len(aborted), 'aborted run')} left out: closed by 'holedger run "
            f"abort' without a score ({', '.join(r[:8] for r in aborted)})"
        )
    return gains, excluded, note, aborted


@analysis_group.command("gains")
@_run_sources
@click.option("--baselines", is_flag=True, help="Include the seed-baseline runs.")
@JSON
@click.pass_context
def gains_cmd(
    ctx: click.Context,
    task_id: str | None,
    verify: bool,
    trusted: tuple[str, ...],
    bundles: tuple[str, ...],
    baselines: bool,
    as_json: bool,
) -> None:
    """Normalized gain g of every scored run, and per (task, task digest, optimizer)
    summaries; from the home's ledger, or from run bundles with --bundle."""
    from holedger.analysis.gains import summarize

    gains, excluded, note, aborted = _collect(ctx, task_id, verify, trusted, bundles, baselines)
    groups = summarize(gains)
    if as_json:
        emit_json(
            {
                "runs": [g.to_json() for g in gains],
                "groups": [s.to_json() for s in groups],
                "replayed": verify,
                "excluded": excluded,
                "aborted": aborted,  # closed by `run abort`: no score, left out
                "note": note,
            }
        )
        return
    if not gains:
        click.echo(f"no scored runs (hint: 'holedger demo' scores one); {note}")
        return
    rows = [
        [
            g.run_id[:8],
            g.task_id,
            g.optimizer,
            decimal(g.e_h_plus),
            decimal(g.e_h0),
            "-" if g.g is None else ("+" if g.g > 0 else "") + decimal(g.g),
            decimal(g.band),
            {"gain": "+ > b", "loss": "- > b"}.get(g.versus_zero or "", "|g| <= b"),
        ]
        for g in gains
    ]
    out = console()
    out.print(
        table("runs", ["run", "task", "optimizer", "E(H+)", "E(H0)", "g", "band", "vs 0"], rows)
    )
    summary_rows = []
    for s in groups:
        data = s.to_json()
        mean_g = "-" if data["mean_g"] is None else f"{data['mean_g']:+.3f}"
        summary_rows.append(
            [
                s.task_id,
                s.task_digest[:12],
                s.optimizer,
                data["runs"],
                mean_g,
                f"{data['resolved_gains']}/{data['resolved_losses']}/{data['within_band']}",
            ]
        )
    out.print(
        table(
            "by task and optimizer",
            ["task", "digest", "optimizer", "runs", "mean g", "gain/loss/within band"],
            summary_rows,
        )
    )
    out.print(plain(note), soft_wrap=True)


@analysis_group.command("capabilities")
@_run_sources
@click.option(
    "--table",
    "table_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Read a published grid (CSV: [benchmark,] agent, evolver (NONE for the base), j "
    "as a pass rate in [0, 1]). Nothing read from it is verified.",
)
@click.option(
    "--in-situ",
    "in_situ",
    is_flag=True,
    help="Build the grids from solve-evolve runs of the home's ledger (in-situ pass rates, "
    "Base from each stream's NONE run) instead of the held-out scores of search runs.",
)
@click.option(
    "--anchor-agent",
    "anchor_agents",
    multiple=True,
    help="An anchor agent (repeat); default: every agent with a complete row.",
)
@click.option(
    "--anchor-evolver",
    "anchor_evolvers",
    multiple=True,
    help="An anchor evolver (repeat); default: every evolver with a complete column.",
)
@JSON
@click.pass_context
def capabilities_cmd(
    ctx: click.Context,
    task_id: str | None,
    verify: bool,
    trusted: tuple[str, ...],
    bundles: tuple[str, ...],
    table_path: str | None,
    in_situ: bool,
    anchor_agents: tuple[str, ...],
    anchor_evolvers: tuple[str, ...],
    as_json: bool,
) -> None:
    """Harness-updating (per evolver: the mean gain over the anchor agents) and
    harness-benefit (per agent: the max gain over the anchor evolvers), with the evolver
    spread, the top evolver's breakdown, within- against between-agent spread, the extreme
    pairing, headroom and regression cells; per task from the held-out scores of search
    runs (the home's ledger, or --bundle), from the in-situ pass rates of solve-evolve runs
    with --in-situ, or from a published grid with --table; one source per call, never
    mixed in a grid, and the output names it."""
    from holedger.analysis.updating import across_benchmarks, analyse, given_anchors
    from holedger.analysis.updating_io import grids_from_gains, grids_from_table
    from holedger.analysis.updating_text import render

    doc: dict[str, Any]
    left: list[tuple[str, str]]
    if in_situ and (table_path is not None or bundles):
        raise UsageError(
            "--in-situ reads the solve-evolve runs of the home's ledger, a source of its own",
            hint="drop --table and --bundle, or drop --in-situ",
        )
    if in_situ:
        from holedger.analysis.insitu import grids_from_ledger
        from holedger.ledger.keys import load_trusted_keys
        from holedger.ledger.store import Ledger

        if trusted and not verify:
            raise UsageError("--trusted-key pins the keys of --verify", hint="add --verify")
        ledger = Ledger.open(settings(ctx).ledger_url, None, create_tables=False)
        try:
            grids, left, used = grids_from_ledger(
                ledger,
                task_id=task_id,
                verify=verify,
                trusted_keys=load_trusted_keys(list(trusted)),
            )
        finally:
            ledger.close()
        doc = {
            "source": "in-situ",
            "runs": used,
            "replayed": verify,
            "excluded": [{"run": r, "why": why} for r, why in left if ":" not in r],
            "note": "solve-evolve runs "
            + ("replayed: only those that verify" if verify else "read without replay"),
        }
        left = [(r, why) for r, why in left if ":" in r]
    elif table_path is not None:
        if bundles or verify or trusted:
            raise UsageError(
                "--table is a source of its own and cannot be verified",
                hint="drop --bundle, --verify and --trusted-key, or drop --table",
            )
        grids = grids_from_table(table_path)
        if task_id:
            grids = [g for g in grids if g.benchmark == task_id]
        from holedger.analysis.sources import UNVERIFIED

        doc = {
            "unverified_notice": UNVERIFIED,
            "source": "table",
            "verified": None,
            "note": UNVERIFIED,
        }
        left = []
    else:
        gains, excluded, note, aborted = _collect(ctx, task_id, verify, trusted, bundles)
        grids, left = grids_from_gains(gains)
        doc = {
            "source": "held-out",
            "runs": len(gains),
            "replayed": verify,
            "excluded": excluded,
            "aborted": aborted,  # closed by `run abort`: no score, left out
            "note": note,
        }
    results = []
    for grid in grids:
        try:
            anchors = given_anchors(grid, anchor_agents, anchor_evolvers)
        except ValueError as exc:
            raise UsageError(
                str(exc), hint="name agents and evolvers as the output spells them"
            ) from None
        results.append(analyse(grid, anchors))
    doc |= {
        "source_detail": (
            "a published table of pass rates"
            if table_path is not None
            else _in_situ_detail()
            if in_situ
            else "held-out scores of search runs: J = E(H+), Base = E(H0)"
        ),
        "grids": results,
        "across_benchmarks": across_benchmarks(results),
        "agents_left_out": [{"agent": a, "why": why} for a, why in left],
    }
    if as_json:
        emit_json(doc)
        return
    render(doc)


def _in_situ_detail() -> str:
    from holedger.analysis.insitu import SOURCE_DETAIL

    return SOURCE_DETAIL


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    from holedger.analysis import grid_commands, run_commands  # noqa: F401  (subcommands)

    cli.add_command(analysis_group)
