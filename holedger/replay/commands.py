"""Command-line commands of the replay room."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
