"""Command-line commands of the gateway room: ``holedger token`` and ``holedger sim serve``."""

from __future__ import annotations

import json
from typing import Any

import click

from holedger.config import Settings


@click.command("token")
@click.argument("run")
@click.option(
    "--scope",
    type=click.Choice(["optimizer"]),
    default="optimizer",
    show_default=True,
    help="Only the optimizer scope: trial tokens are issued by the server for each trial.",
)
@click.option("--ttl", "ttl_s", type=click.IntRange(min=1), default=None, help="Expire after N s.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@click.pass_obj
def token_command(
    settings: Settings, run: str, scope: str, ttl_s: int | None, as_json: bool
) -> None:
    """Print a gateway token for RUN's optimizer scope (metered and capped); a closed
    run is refused: its tokens died with it."""
    from holedger.errors import RunClosedError
    from holedger.gateway.tokens import TokenRegistry
    from holedger.ledger.store import Ledger

    ledger = Ledger.from_settings(settings)
    try:
        run_id = ledger.resolve_run(run)
        ledger.run_terms(run_id)
        if ledger.is_closed(run_id):
            raise RunClosedError(
                f"run {run_id} is closed: its tokens died with it",
                hint="open a new run ('holedger run open') for more calls",
            )
        token = TokenRegistry(ledger.app.engine).issue_optimizer_token(run_id, ttl_s=ttl_s)
    finally:
        ledger.close()
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "scope": scope, "token": token}))
    else:
        click.echo(token)


@click.group("sim")
def sim_group() -> None:
    """The built-in offline simulator of a target model."""


@sim_group.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8400, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--chunk-delay", type=float, default=0.0, help="Seconds between stream chunks.")
@click.option(
    "--latency", type=click.FloatRange(min=0), default=0.0, help="Seconds before each answer."
)
def sim_serve(host: str, port: int, seed: int, chunk_delay: float, latency: float) -> None:
    """Serve the simulator as an OpenAI-compatible upstream at http://HOST:PORT/v1."""
    from holedger.gateway.serve import AppServer
    from holedger.gateway.sim_server import create_simulator_app

    app = create_simulator_app(seed, chunk_delay_s=chunk_delay, latency_s=latency)
    server = AppServer(app, host=host, port=port)
    click.echo(f"simulator listening on {server.base_url}", err=True)
    server.run()


def upstreams_section(settings: Any) -> tuple[str, Any, Any]:
    """`holedger doctor`'s upstreams section; its module (an HTTP client, every wire
    format) loads when doctor runs, not with every command."""
    from holedger.gateway.doctor import doctor_section

    return doctor_section(settings)


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    from holedger.sandboxes.commands import DOCTOR_SECTIONS

    cli.add_command(token_command)
    cli.add_command(sim_group)
    if upstreams_section not in DOCTOR_SECTIONS:
        DOCTOR_SECTIONS.append(upstreams_section)  # `holedger doctor` checks the upstreams
