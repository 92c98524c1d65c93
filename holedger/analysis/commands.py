"""`holedger analysis gains`: normalized gains of scored runs against resolution bands."""

from __future__ import annotations

import click

from holedger.errors import UsageError
from holedger.output import console, emit_json, plain, settings, table
from holedger.replay.report import counted


@click.group("analysis")
def analysis_group() -> None:
    """Cross-run statistics computed from the ledger."""


@analysis_group.command("gains")
@click.option("--task", "task_id", default=None, help="Only runs of this task.")
@click.option("--verify", is_flag=True, help="Replay each run; count only verified runs.")
@click.option(
    "--trusted-key",
    "trusted",
    multiple=True,
    help="With --verify: a verifier key (name+id+key) or keyring file pinning the runs' keys.",
)
@click.option(
    "--bundle",
    "bundles",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Read runs from these bundles (holedger export) instead of the home's ledger.",
)
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
    from holedger.analysis.gains import collect, collect_bundles, summarize
    from holedger.ledger.keys import load_trusted_keys
    from holedger.ledger.store import Ledger

    if trusted and not verify:
        raise UsageError("--trusted-key pins the keys of --verify", hint="add --verify")
    keys = load_trusted_keys(list(trusted))
    excluded: list[str] = []
    if bundles:
        gains = collect_bundles(
            list(bundles),
            task_id=task_id,
            include_baselines=baselines,
            verify=verify,
            excluded=excluded,
            trusted_keys=keys,
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
            )
        finally:
            ledger.close()
    groups = summarize(gains)
    if as_json:
        emit_json(
            {
                "runs": [g.to_json() for g in gains],
                "groups": [s.to_json() for s in groups],
                "replayed": verify,
                "excluded": excluded,
            }
        )
        return
    if verify:
        see = "holedger verify BUNDLE" if bundles else "holedger replay RUN"
        note = (
            f"{counted(len(excluded), 'scored run')} left out: replay does not verify "
            f"{', '.join(r[:8] for r in excluded)} (see '{see}')"
            if excluded
            else "every scored run verifies"
        )
        if not keys:
            note += " (under the keys each run declares: pin them with --trusted-key)"
    else:
        note = "not replayed: --verify counts only the runs that verify"
    if not gains:
        click.echo(f"no scored runs (hint: 'holedger demo' scores one); {note}")
        return
    rows = [
        [
            g.run_id[:8],
            g.task_id,
            g.optimizer,
            f"{float(g.e_h_plus):.3f}",
            f"{float(g.e_h0):.3f}",
            "-" if g.g is None else f"{float(g.g):+.3f}",
            f"{float(g.band):.3f}",
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


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    cli.add_command(analysis_group)
