"""The `holedger analysis` group and the options its commands share (which runs, from
where, which keys, JSON): the bottom of the room's command modules, which each add their
commands to the group."""

from __future__ import annotations

import click

from holedger.replay.options import trusted_key_option


@click.group("analysis")
def analysis_group() -> None:
    """Cross-run statistics from the ledger, run bundles or a published results table."""


TASK = click.option("--task", "task_id", default=None, help="Only runs of this task.")
BUNDLES = click.option(
    "--bundle",
    "bundles",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Read runs from these bundles (holedger export) instead of the home's ledger.",
)
TRUSTED = trusted_key_option(
    "With verification: a verifier key (name+id+key) or keyring file pinning the runs' keys."
)
JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
