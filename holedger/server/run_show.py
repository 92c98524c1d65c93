"""``holedger run show``: one run as the server reads it.

Its task, the keys it declares, its events counted by type, its budget (limit, used and
remaining per component, tokens included, :mod:`holedger.server.budget_view`) and the
accepted requests still without trials, from the server's own fold of its events
(:mod:`holedger.server.state`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import click

from holedger.errors import HoledgerError
from holedger.ledger.keys import PublicKey
from holedger.numbers import decimal, se_text
from holedger.output import console, emit_json, settings, table
from holedger.replay.report import counted

if TYPE_CHECKING:
    from holedger.server.state import RunState


@click.command("show")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def run_show(ctx: click.Context, run: str, as_json: bool) -> None:
    """Show one run: its task, keys, event counts by type, its budget (limit, used and
    remaining per component, tokens included), and accepted requests still without
    trials."""
    from holedger.ledger.store import Ledger

    ledger = Ledger.from_settings(settings(ctx))
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
        "rescore_of": None if opened.rescore_of is None else opened.rescore_of.model_dump(),
        "control_of": None if opened.control_of is None else opened.control_of.model_dump(),
        "scored": _scored_json(state),
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
    scored = _scored_json(state)
    if scored is not None:
        _print_scored(scored)
    if opened.rescore_of is not None:
        of = opened.rescore_of
        click.echo(
            f"re-scoring {of.index} of run {of.run_id}: its nominee {of.candidate[:12]} "
            f"(tree {of.tree[:12]}) on the test split"
        )
    if opened.control_of is not None:
        click.echo(
            f"control run of audit {opened.control_of.audit_id} of run "
            f"{opened.control_of.run_id}: its trials are that audit's control evaluations, "
            "shown to no optimizer and left out of every analysis"
        )
    if unprojected:
        click.echo(
            f"{counted(len(unprojected), 'accepted request')} without trials or projection "
            f"yet: {', '.join(unprojected)} (still being evaluated, or left by a server that "
            f"stopped: 'holedger run recover {run_id}' records them)"
        )


def _scored_json(state: RunState | None) -> dict[str, Any] | None:
    """The run's held-out score with its error bars (A3), when it has one."""
    scored = None if state is None else state.scored
    if scored is None:
        return None
    return {
        "candidate": scored.candidate,
        "k": scored.k,
        "e_h_plus": scored.e_h_plus,
        "e_h_plus_se": None if scored.e_h_plus_error is None else scored.e_h_plus_error.se,
        "e_h0": scored.e_h0,
        "e_h0_se": None if scored.e_h0_error is None else scored.e_h0_error.se,
        "g": scored.g,
    }


def _print_scored(scored: dict[str, Any]) -> None:
    k = scored["k"]
    click.echo(f"E(H+) {decimal(scored['e_h_plus'])}{se_text(scored['e_h_plus_se'], k)}")
    click.echo(f"E(H0) {decimal(scored['e_h0'])}{se_text(scored['e_h0_se'], k)} (pinned)")
    click.echo(f"g     {decimal(scored['g'])}")


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
