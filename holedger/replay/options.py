"""The command-line options of the commands that verify a log: `holedger replay`, the
bundle room's verify, verify-proof and verify-attestation, and the rooms above them (the
keys to pin, the task of the leakage audit, a witness policy); and one decorator that
applies several options in the order --help lists them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

# Keys given here replace the ones the log announces.
PINS_THE_RUN = "A verifier key (name+id+key) or a keyring file; pins the run's keys."


def with_options(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying ``options`` in the order given (as --help lists them)."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def trusted_key_option(help: str = PINS_THE_RUN, *, required: bool = False) -> Callable[[F], F]:
    """``--trusted-key`` (repeatable), passed as ``trusted``."""
    return click.option("--trusted-key", "trusted", multiple=True, required=required, help=help)


# ``--task`` of the commands that replay a run with its leakage audit.
audit_task_option = click.option(
    "--task",
    "task",
    default=None,
    help="A task name or folder for the leakage audit (default: the task the run names).",
)


def witness_options(policy_help: str) -> Callable[[F], F]:
    """``--policy``, ``--witness`` (repeatable) and ``--quorum``: the witness policy a
    checkpoint is held to, as a C2SP tlog-policy file or as witnesses and a quorum."""
    return with_options(
        click.option("--policy", "policy_file", help=policy_help),
        click.option(
            "--witness",
            "witnesses",
            multiple=True,
            help="A witness cosigner vkey (0x04), or a file of them; repeatable.",
        ),
        click.option("--quorum", type=int, help="How many --witness cosignatures are needed."),
    )
