"""The `holedger analysis` group and the options its commands share (which runs, from
where, which keys, JSON): the bottom of the room's command modules, which each add their
commands to the group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click


@click.group("analysis")
def analysis_group() -> None:
    """Cross-run statistics from the ledger, run bundles or a published results table."""


_F = TypeVar("_F", bound=Callable[..., Any])


TASK = click.option("--task", "task_id", default=None, help="Only runs of this task.")
BUNDLES = click.option(
    "--bundle",
    "bundles",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Read runs from these bundles (holedger export) instead of the home's ledger.",
)
TRUSTED = click.option(
    "--trusted-key",
    "trusted",
    multiple=True,
    help="With verification: a verifier key (name+id+key) or keyring file pinning the runs' keys.",
)
JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def with_options(*options: Callable[[_F], _F]) -> Callable[[_F], _F]:
    """One decorator applying ``options`` in the order given (as --help lists them)."""

    def decorate(command: _F) -> _F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate
