"""The command-line options that name who ran a search (``run open``, ``demo``): the
signed optimizer descriptor of RunOpened, from which every cross-run grid takes its keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from holedger.errors import UsageError
from holedger.schemas.events import OptimizerDescriptor

_F = TypeVar("_F", bound=Callable[..., Any])

_OPTIONS = (
    ("--model", "opt_model", "The optimizer's model (signed; a grid's model key)."),
    ("--family", "opt_family", "The model's family (for the release ladder)."),
    ("--release", "opt_release", "The model's release: an ordinal (3) or a date (2026-05-01)."),
    ("--harness", "opt_harness", "The coding harness the optimizer ran in (a grid's key)."),
)


def descriptor_options(command: _F) -> _F:
    """Add --model, --family, --release, --harness, --harness-scope and --replicate."""
    command = click.option(
        "--replicate",
        "opt_replicate",
        type=int,
        default=None,
        help="Replicate index of this configuration (default 1).",
    )(command)
    command = click.option(
        "--harness-scope",
        "opt_scope",
        type=click.Choice(["native", "common"]),
        default=None,
        help="native: the model's own harness; common: one shared by the grid (default).",
    )(command)
    for flag, name, text in reversed(_OPTIONS):
        command = click.option(flag, name, default=None, help=text)(command)
    return command


def descriptor_from(
    model: str | None,
    family: str | None,
    release: str | None,
    harness: str | None,
    scope: str | None,
    replicate: int | None,
) -> OptimizerDescriptor | None:
    """The descriptor the options give, None when none is given; a UsageError naming the
    option when one is given without --model and --harness, or a value does not fit."""
    given = [v is not None for v in (model, family, release, harness, scope, replicate)]
    if not any(given):
        return None
    if model is None or harness is None:
        missing = "--model" if model is None else "--harness"
        raise UsageError(
            f"the optimizer descriptor needs {missing}",
            hint="give --model and --harness (and optionally --family, --release, "
            "--harness-scope, --replicate)",
        )
    try:
        return OptimizerDescriptor(
            model=model,
            family=family,
            release=release,
            harness=harness,
            harness_scope="native" if scope == "native" else "common",
            replicate=1 if replicate is None else replicate,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "descriptor"
        flag = {"harness_scope": "harness-scope"}.get(field, field)
        raise UsageError(
            f"--{flag}: {err['msg']}",
            hint="--release is an ordinal (3) or a date (2026-05-01); --replicate is 1 or more",
        ) from None
