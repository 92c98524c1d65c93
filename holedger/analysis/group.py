"""The `holedger analysis` group and the options its commands share (which runs, from
where, which keys, JSON): the bottom of the room's command modules, which each add their
commands to the group."""

from __future__ import annotations

from typing import Any

import click

from holedger.replay.options import F, trusted_key_option


@click.group("analysis")
def analysis_group() -> None:
    """Cross-run statistics from the ledger, run bundles or a published results table."""


TASK = click.option("--task", "task_id", default=None, help="Only runs of this task.")
_BUNDLE_FILE = click.Path(exists=True, dir_okay=False)
_MORE = "holedger.analysis.more_bundles"


def _bundle_option(ctx: click.Context, _: click.Parameter, value: tuple[str, ...]) -> Any:
    return (*value, *ctx.meta.pop(_MORE, ()))


def _more_bundles(ctx: click.Context, _: click.Parameter, value: tuple[str, ...]) -> None:
    # Files after the options are bundles too, so `--bundle runs/*.hlb` reads every file
    # the shell's glob gives; whichever of the two is processed second merges them.
    if "bundles" in ctx.params:
        ctx.params["bundles"] = (*ctx.params["bundles"], *value)
    else:
        ctx.meta[_MORE] = value


def BUNDLES(command: F) -> F:
    """``--bundle FILE`` (repeatable) and the ``[BUNDLE]...`` that follow: run bundles."""
    command = click.argument(
        "more_bundles",
        nargs=-1,
        type=_BUNDLE_FILE,
        metavar="[BUNDLE]...",
        expose_value=False,
        callback=_more_bundles,
    )(command)
    return click.option(
        "--bundle",
        "bundles",
        multiple=True,
        type=_BUNDLE_FILE,
        callback=_bundle_option,
        help="Read runs from these bundles (holedger export) instead of the home's ledger; "
        "files after the options are bundles too (--bundle runs/*.hlb).",
    )(command)


TRUSTED = trusted_key_option(
    "With verification: a verifier key (name+id+key) or keyring file pinning the runs' keys."
)
JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
