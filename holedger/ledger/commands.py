"""`holedger init`, `holedger keys show`, `holedger run list | show`."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from holedger.ledger.store import Ledger

from holedger.errors import HoledgerError
from holedger.ledger.keys import PublicKey
from holedger.output import console, emit_json, settings, table
from holedger.replay.report import counted


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
    rows = [[i.run_id, i.task_id, i.optimizer, i.events, i.state, _minute(i.opened)] for i in infos]
    columns = ["run", "task", "optimizer", "events", "state", "opened (UTC)"]
    whole = ("run", "events", "state", "opened (UTC)")
    console().print(table(None, columns, rows, whole=whole))


def _minute(time: str) -> str:
    """2026-12-02T14:26:30.123456Z as 2026-12-02 14:26."""
    return time[:16].replace("T", " ")


@run_group.command("show")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def run_show(ctx: click.Context, run: str, as_json: bool) -> None:
    """Show one run: its task, keys, event counts by type, its budget (limit, used and
    remaining per component, tokens included), and accepted requests still without
    trials."""
    ledger = open_ledger(ctx)
    run_id = ledger.resolve_run(run)
    opened = ledger.run_terms(run_id)
    from pydantic import ValidationError

    from holedger.server.state import RunState

    counts: Counter[str] = Counter()
    # The server's own fold says which accepted requests have no projection yet; a run
    # whose events do not fold (replay names why) is shown without that list.
    state: RunState | None = RunState(run_id, opened)
    for rec in ledger.records(run_id):
        counts[rec.type] += 1
        try:
            if state is not None:
                state.apply(rec)
        except (ValidationError, HoledgerError, KeyError, TypeError):
            state = None
    unprojected = list(state.pending) if state is not None else []
    from holedger.server.budget_view import budget_rows

    budget = budget_rows(state, opened.terms) if state is not None else []
    info = next(i for i in ledger.runs() if i.run_id == run_id)
    data = {
        "run_id": run_id,
        "task_id": opened.task_id,
        "task_digest": opened.task_digest,
        "optimizer": opened.optimizer,
        "state": info.state,
        "events": info.events,
        "by_type": dict(sorted(counts.items())),
        "unprojected_requests": list(unprojected),
        "budget": budget,
        "keys": {
            role: {**k.model_dump(), "vkey": _declared_vkey(k.name, k.public_key, k.key_id)}
            for role, k in opened.keys.items()
        },
    }
    if as_json:
        emit_json(data)
        return
    click.echo(f"run {run_id}  task {opened.task_id}  optimizer {opened.optimizer}  {info.state}")
    for role, declared in sorted(opened.keys.items()):
        # As declared by the run, as verifier keys (replay checks them; a verifier pins one
        # with --trusted-key after getting it from the operator, not from the run).
        vkey = _declared_vkey(declared.name, declared.public_key, declared.key_id)
        click.echo(f"key {role}  {vkey or 'malformed (replay reports it)'}")
    rows = [[name, n] for name, n in sorted(counts.items())]
    console().print(table(None, ["event", "count"], rows))
    if budget:
        rows = [[r["component"], r["limit"], r["used"], r["remaining"]] for r in budget]
        rows = [[_shown(cell) for cell in row] for row in rows]
        columns = ["component", "limit", "used", "remaining"]
        console().print(table("budget", columns, rows, whole=tuple(columns)))
    if unprojected:
        click.echo(
            f"{counted(len(unprojected), 'accepted request')} without trials or projection "
            f"yet: {', '.join(unprojected)} (still being evaluated, or left by a server that "
            f"stopped: 'holedger run recover {run_id}' records them)"
        )


def _shown(value: object) -> str:
    """A budget cell: a whole number as it is, an exact rational with its decimal."""
    if value is None:
        return "-"
    text = str(value)
    if "/" in text:
        from fractions import Fraction

        return f"{float(Fraction(text)):.3f} ({text})"
    return text


def _declared_vkey(name: str, public_key: str, key_id: str) -> str | None:
    """The verifier key a run declares, or None when the declaration does not hold one
    (not 32 bytes, or not the key id it claims)."""
    key = PublicKey.declared(name, public_key)
    return key.vkey() if len(key.raw) == 32 and key.key_id_hex == key_id else None


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    cli.add_command(init_cmd)
    cli.add_command(keys_group)
    cli.add_command(run_group)
