"""`holedger init`, `holedger keys show`, `holedger run list` (``run show``, which reads a
run as the server folds it, is the server room's)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from holedger.ledger.store import Ledger, RunInfo

from holedger.output import console, emit_json, settings, table


def open_ledger(ctx: click.Context) -> Ledger:
    """The home's ledger, signed with the home's key."""
    from holedger.ledger.store import Ledger

    return Ledger.from_settings(settings(ctx))


@click.command("init")
@click.option(
    "--key-name",
    default="holedger-operator",
    show_default=True,
    help="C2SP signed-note name of the operator key.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def init_cmd(ctx: click.Context, key_name: str, as_json: bool) -> None:
    """Create the home: the operator key (mode 0600) and the ledger."""
    cfg = settings(ctx)
    from holedger.ledger.store import Ledger

    key, created = Ledger.init_home(cfg, key_name)
    data = {
        "home": str(cfg.home),
        "ledger": cfg.ledger_url,
        "key": str(cfg.key_path),
        "vkey": key.public.vkey(),
        "created_key": created,
    }
    if as_json:
        emit_json(data)
        return
    verb = "created" if created else "kept existing"
    click.echo(f"home    {cfg.home}")
    click.echo(f"ledger  {cfg.ledger_url}")
    click.echo(f"key     {cfg.key_path} ({verb})")
    click.echo(f"vkey    {key.public.vkey()}")


@click.group("keys")
def keys_group() -> None:
    """The operator's keys."""


@keys_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def keys_show(ctx: click.Context, as_json: bool) -> None:
    """Print the operator's verifier key (give it to verifiers for --trusted-key)."""
    from holedger.ledger.keys import SigningKey

    key = SigningKey.load(settings(ctx).key_path)
    if as_json:
        emit_json({"name": key.name, "key_id": key.key_id_hex, "vkey": key.public.vkey()})
    else:
        click.echo(key.public.vkey())


@click.group("run")
def run_group() -> None:
    """Runs: open, list, show, recover, abort."""


@run_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def run_list(ctx: click.Context, as_json: bool) -> None:
    """List the runs in the ledger with their state."""
    ledger = open_ledger(ctx)
    infos = ledger.runs()
    if as_json:
        emit_json([asdict(info) for info in infos])
        return
    if not infos:
        click.echo("no runs yet (hint: 'holedger demo' or 'holedger run open --task T')")
        return
    # The opening time to the minute (UTC), kept whole; --json has it to the microsecond.
    rows = [
        [i.run_id, i.task_id, _optimizer(i), i.events, i.state, _minute(i.opened)] for i in infos
    ]
    columns = ["run", "task", "optimizer", "events", "state", "opened (UTC)"]
    whole = ("run", "events", "state", "opened (UTC)")
    console().print(table(None, columns, rows, whole=whole))


def _optimizer(info: RunInfo) -> str:
    """The optimizer column: an audit's control run says so (no optimizer searched in it)."""
    of = info.control_of
    if of is None:
        return info.optimizer
    return f"control run of audit {of.get('audit_id')} of run {of.get('run_id')}"


def _minute(time: str) -> str:
    """2026-12-02T14:26:30.123456Z as 2026-12-02 14:26."""
    return time[:16].replace("T", " ")


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    cli.add_command(init_cmd)
    cli.add_command(keys_group)
    cli.add_command(run_group)
