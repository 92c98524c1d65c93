"""`holedger analysis gains` (normalized gains of scored runs against resolution bands) and
`holedger analysis capabilities` (harness-updating per optimizer, harness-benefit per
target model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from holedger.errors import UsageError
from holedger.numbers import decimal
from holedger.output import console, emit_json, plain, settings, table
from holedger.replay.report import counted

if TYPE_CHECKING:
    from holedger.analysis.gains import RunGain


@click.group("analysis")
def analysis_group() -> None:
    """Cross-run statistics from the ledger, run bundles or a published results table."""


_F = TypeVar("_F", bound=Callable[..., Any])


def _run_sources(command: _F) -> _F:
    """The options every analysis takes: which runs, from where, replayed or not."""
    for option in reversed(
        [
            click.option("--task", "task_id", default=None, help="Only runs of this task."),
            click.option(
                "--verify", is_flag=True, help="Replay each run; count only verified runs."
            ),
            click.option(
                "--trusted-key",
                "trusted",
                multiple=True,
                help="With --verify: a verifier key (name+id+key) or keyring file pinning "
                "the runs' keys.",
            ),
            click.option(
                "--bundle",
                "bundles",
                multiple=True,
                type=click.Path(exists=True, dir_okay=False),
                help="Read runs from these bundles (holedger export) instead of the home's ledger.",
            ),
        ]
    ):
        command = option(command)
    return command


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
    from holedger.analysis.gains import collect, collect_bundles
    from holedger.ledger.keys import load_trusted_keys
    from holedger.ledger.store import Ledger

    if trusted and not verify:
        raise UsageError("--trusted-key pins the keys of --verify", hint="add --verify")
    keys = load_trusted_keys(list(trusted))
    excluded: list[str] = []
    no_baseline: list[str] = []
    aborted: list[str] = []
    if bundles:
        gains = collect_bundles(
            list(bundles),
            task_id=task_id,
            include_baselines=baselines,
            verify=verify,
            excluded=excluded,
            trusted_keys=keys,
            no_baseline=no_baseline,
            aborted=aborted,
        )
    else:
        cfg = settings(ctx)
        ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
        try:
            gains = collect(
                ledger,
                task_id=task_id,
                include_baselines=baselines,
                verify=verify,
                excluded=excluded,
                trusted_keys=keys,
                aborted=aborted,
            )
        finally:
            ledger.close()
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
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
            "yes" if g.above_band else "no",
        ]
        for g in gains
    ]
    out = console()
    out.print(
        table("runs", ["run", "task", "optimizer", "E(H+)", "E(H0)", "g", "band", "> band"], rows)
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
                f"{data['above_band']}/{data['runs']}",
            ]
        )
    out.print(
        table(
            "by task and optimizer",
            ["task", "digest", "optimizer", "runs", "mean g", "> band"],
            summary_rows,
        )
    )
    out.print(plain(note), soft_wrap=True)


@analysis_group.command("capabilities")
@_run_sources
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def capabilities_cmd(
    ctx: click.Context,
    task_id: str | None,
    verify: bool,
    trusted: tuple[str, ...],
    bundles: tuple[str, ...],
    as_json: bool,
) -> None:
    """Harness-updating (per optimizer) and harness-benefit (per target model): per task,
    the mean held-out gain E(H+) - E(H0) of each optimizer x target-model pair, with row
    and column means; from the home's ledger, or from run bundles with --bundle."""
    from holedger.analysis.capabilities import agent_label, capabilities

    gains, excluded, note, aborted = _collect(ctx, task_id, verify, trusted, bundles)
    tables = capabilities(gains)
    if as_json:
        emit_json(
            {
                "tasks": [t.to_json() for t in tables],
                "runs": len(gains),
                "replayed": verify,
                "excluded": excluded,
                "aborted": aborted,  # closed by `run abort`: no score, left out
                "note": note,
            }
        )
        return
    if not tables:
        click.echo(f"no scored runs (hint: 'holedger demo' scores one); {note}")
        return
    out = console()

    def points(value: Any, whole: bool = True) -> str:
        return "-" if value is None else f"{float(value) * 100:+.1f}{'' if whole else '*'}"

    partial = False
    for t in tables:
        agents = t.agents
        rows = []
        for o in t.optimizers:
            mean, _, whole = t.updating(o)
            partial = partial or not whole
            rows.append([o, *(points(t.cell(o, a)) for a in agents), points(mean, whole)])
        benefit = []
        for a in agents:
            mean, _, whole = t.benefit(a)
            partial = partial or not whole
            benefit.append(points(mean, whole))
        rows.append(["harness-benefit", *benefit, ""])
        headings = ["optimizer", *(agent_label(a) for a in agents), "harness-updating"]
        title = f"{t.task_id}: held-out gain E(H+) - E(H0), points"
        out.print(table(title, headings, rows))
        spread = t.spread()
        if spread is not None:
            out.print(f"updating spread (complete rows): {float(spread) * 100:.1f} points")
    if partial:
        out.print("* a mean over the cells present: the row or column has a missing cell")
    out.print(plain(note), soft_wrap=True)


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    from holedger.analysis import grid_commands, run_commands  # noqa: F401  (subcommands)

    cli.add_command(analysis_group)
