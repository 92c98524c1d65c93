"""Command-line commands of the ledger room."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
