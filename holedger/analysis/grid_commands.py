"""`holedger analysis grid|lss|contrasts|ladder|levers|trace|budget|tokens|optimism|
frontier|bands` and `holedger analysis report`: the cross-run analyses of a grid of runs,
from the home's ledger, from run bundles (verified by default) or from a published
results table (never verified: every output says so first)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar

import click

from holedger.analysis.csvtable import plain_number
from holedger.analysis.group import BUNDLES, JSON, TASK, TRUSTED, analysis_group
from holedger.errors import UsageError
from holedger.output import console, emit_json, plain, settings, table
from holedger.replay.options import with_options

if TYPE_CHECKING:
    from holedger.analysis.sources import Source

_F = TypeVar("_F", bound=Callable[..., Any])


# The options of every grid analysis: runs from the ledger or bundles, or a table.
_grid_sources = with_options(
    TASK,
    BUNDLES,
    click.option(
        "--table",
        "table_path",
        default=None,
        type=click.Path(exists=True, dir_okay=False),
        help="Read a published results table (CSV: model, harness, [scope, family, "
        "release,] one column of g per task). Nothing read from it is verified.",
    ),
    click.option(
        "--band",
        "bands",
        multiple=True,
        help="TASK=B: the resolution band of a table's task holedger does not know.",
    ),
    click.option(
        "--verify/--no-verify",
        default=None,
        help="Replay each run and count only the runs that verify (default: on for "
        "--bundle, off for the ledger).",
    ),
    TRUSTED,
    JSON,
)


def load_source(
    ctx: click.Context,
    task_id: str | None,
    bundles: tuple[str, ...],
    table_path: str | None,
    bands: tuple[str, ...],
    verify: bool | None,
    trusted: tuple[str, ...],
) -> Source:
    """The Source the options name; a UsageError for options that do not go together."""
    from holedger.analysis.sources import from_runs, from_table, parse_bands
    from holedger.ledger.keys import load_trusted_keys

    if table_path is not None:
        if bundles:
            raise UsageError("--table and --bundle are two sources", hint="give one of them")
        if verify or trusted:
            raise UsageError(
                "a table cannot be verified", hint="verify the runs' bundles with --bundle"
            )
        source = from_table(table_path, parse_bands(bands))
        if task_id:
            source.observations = [o for o in source.observations if o.task == task_id]
        return source
    if bands:
        raise UsageError("--band gives a table's bands", hint="runs carry their own band")
    if verify is None:
        verify = bool(bundles)
    if trusted and not verify:
        raise UsageError("--trusted-key pins the keys of verification", hint="drop --no-verify")
    keys = load_trusted_keys(list(trusted))
    cfg = None if bundles else settings(ctx)
    return from_runs(
        ledger_url=None if cfg is None else cfg.ledger_url,
        runs_dir=None if cfg is None else cfg.runs_dir,
        bundles=bundles,
        task_id=task_id,
        verify=verify,
        trusted_keys=keys,
    )


def _head(source: Source) -> None:
    """The first line of a table's output: nothing in it is verified."""
    if source.first_line:
        click.echo(source.first_line)


def _tail(data: dict[str, Any]) -> None:
    out = console()
    for reading in data.get("readings", []):
        out.print(plain(f"reading: {reading}"), soft_wrap=True)
    left = data.get("runs_left_out", [])
    for item in left[:20]:
        out.print(plain(f"left out: {item['run'][:8]}: {item['why']}"), soft_wrap=True)
    if len(left) > 20:
        out.print(f"left out: {len(left) - 20} more (see --json)")
    if data.get("note") and data["note"] != data.get("unverified_notice"):
        out.print(plain(data["note"]), soft_wrap=True)


def _f(value: Any, signed: bool = True) -> str:
    """A quantity to three decimals, rounded on its exact value ('-' when none)."""
    from holedger.numbers import decimal

    if value is None:
        return "-"
    text = decimal(value)
    return f"+{text}" if signed and not text.startswith("-") else text


def _show(ctx: click.Context, compute: Callable[[Source], dict[str, Any]], render: Any) -> None:
    params = ctx.params
    source = load_source(
        ctx,
        params["task_id"],
        params["bundles"],
        params["table_path"],
        params["bands"],
        params["verify"],
        params["trusted"],
    )
    data = compute(source)
    if params["as_json"]:
        emit_json(data)
        return
    _head(source)
    if not source.observations:
        click.echo(
            "no run in the grid: a run enters it closed, scored and opened with "
            "--model and --harness (runs left out are named below)"
        )
    elif data.get("refused"):
        click.echo(f"refused: {data['refused']}")
    else:
        render(data)
    _tail(data)


Render = Callable[[dict[str, Any]], None]


def grid_analysis(name: str, compute: str) -> Callable[[Render], click.Command]:
    """A grid analysis as a command: the source options, ``suite.<compute>`` of the source
    (``--json`` prints it), and the decorated function rendering it as text; that
    function's docstring is the command's help."""

    def make(render: Render) -> click.Command:
        @analysis_group.command(name, help=inspect.getdoc(render))
        @_grid_sources
        @click.pass_context
        def command(ctx: click.Context, /, **_: Any) -> None:
            from holedger.analysis import suite

            _show(ctx, getattr(suite, compute), render)

        return command

    return make


@grid_analysis("grid", "grid_json")
def _render_grid(data: dict[str, Any]) -> None:
    """Mean, min-max range and n of g per (task, optimizer model, harness), with the band (A6)."""
    rows = [
        [
            c["task"],
            c["model"],
            c["harness"],
            c["harness_scope"],
            c["n"] + c["undefined_g"],
            _f(c["mean_g"]),
            f"{_f(c['min_g'])} .. {_f(c['max_g'])}",
            _f(c["band"], False),
            {True: "|g|<=b", False: "|g|>b", None: "-"}[c["indistinguishable_from_zero"]],
        ]
        for c in data["cells"]
    ]
    heads = ["task", "model", "harness", "scope", "runs", "mean g", "range", "band", "vs 0"]
    console().print(table("results grid", heads, rows))
    for note in data["band_notes"]:
        click.echo(note)


@analysis_group.command("lss")
@_grid_sources
@click.option(
    "--harness", default=None, help="The shared harness (default: the common one with most cells)."
)
@click.option(
    "--unbalanced",
    type=click.Choice(["lsq", "refuse"]),
    default="lsq",
    show_default=True,
    help="A grid with missing cells: fit by least squares, or refuse it.",
)
@click.option(
    "--resolution",
    default=None,
    help="Tier resolution (default: from replicates, else the paper's 0.058).",
)
@click.option("--exclude-task", multiple=True, help="Leave a task out of the composite.")
@click.pass_context
def lss_cmd(
    ctx: click.Context,
    /,
    harness: str | None,
    unbalanced: str,
    resolution: str | None,
    exclude_task: tuple[str, ...],
    **_: Any,
) -> None:
    """LSS-lambda: the task-adjusted optimizer-model effect with tiers and both auxiliary
    estimators (A7)."""
    from holedger.analysis.suite import lss_json

    res = _fraction(resolution, "--resolution")

    def compute(source: Source) -> dict[str, Any]:
        return lss_json(
            source,
            harness=harness,
            unbalanced=unbalanced,
            resolution=res,
            exclude_tasks=exclude_task,
        )

    def render(data: dict[str, Any]) -> None:
        tier_of = {m: i + 1 for i, tier in enumerate(data["tiers"]) for m in tier}
        rows = [
            [
                m,
                _f(data["lambda"][m]),
                tier_of[m],
                "-"
                if data["standardized_gain"][m] is None
                else f"{data['standardized_gain'][m]:+.3f}",
                _f(data["mean_rank"].get(m), False),
            ]
            for tier in data["tiers"]
            for m in tier
        ]
        title = f"LSS-lambda on {data['harness']} over {', '.join(data['tasks'])}"
        console().print(table(title, ["model", "lambda", "tier", "std gain", "mean rank"], rows))
        click.echo(f"fit: {data['fit']}")
        click.echo(f"tier resolution {_f(data['resolution'], False)} ({data['resolution_source']})")
        if data["tasks_left_out"]:
            click.echo(f"tasks left out: {', '.join(data['tasks_left_out'])}")

    _show(ctx, compute, render)


def _fraction(text: str | None, option: str) -> Fraction | None:
    """A resolution in units of g: a decimal or p/q in [0, 1], as a band is."""
    if text is None:
        return None
    value = plain_number(text.strip())
    if value is None or not 0 <= value <= 1:
        raise UsageError(
            f"{option} {text!r} is not a number in [0, 1]", hint="e.g. 0.058, the paper's"
        )
    return value


@analysis_group.command("contrasts")
@_grid_sources
@click.option("--harness", default=None, help="The reference common harness.")
@click.pass_context
def contrasts_cmd(ctx: click.Context, /, harness: str | None, **_: Any) -> None:
    """Model-swap vs harness-swap effects and their ratio (A8), native vs common wins
    (A9), the multi-harness axis (A10)."""
    from holedger.analysis.suite import contrasts_json

    def render(data: dict[str, Any]) -> None:
        click.echo(
            f"model effect   {_f(data['model_effect'], False)} over "
            f"{data['model_effect_pairs']} model pairs "
            f"({_f(data['model_effect_in_bands'], False)} bands)"
        )
        click.echo(
            f"harness effect {_f(data['harness_effect'], False)} over "
            f"{data['harness_effect_pairs']} (model, task) pairs, native vs "
            f"{data['reference_common_harness']} "
            f"({_f(data['harness_effect_in_bands'], False)} bands)"
        )
        click.echo(f"ratio          {_f(data['ratio_model_to_harness'], False)}")
        w = data["wins"]
        click.echo(
            f"wins: common {w['common_wins']}, native {w['native_wins']}, ties {w['ties']}; "
            f"beyond band {w['beyond_band']} (native better {w['beyond_band_native_better']}, "
            f"common better {w['beyond_band_common_better']})"
        )
        rows = [
            [
                p["task"],
                p["model"],
                p["native_harness"],
                _f(p["native"]),
                _f(p["common"]),
                _f(p["delta"]),
                p["winner"],
                "yes" if p["beyond_band"] else "no",
            ]
            for p in data["native_vs_common"]
        ]
        heads = ["task", "model", "native", "g native", "g common", "delta", "winner", "> band"]
        console().print(table("native vs common", heads, rows))
        for a in data["harness_axis"]:
            click.echo(
                f"{a['task']} {a['model']}: native - best shared ({a['best_common_harness']}) "
                f"= {_f(a['native_minus_best_common'])} ({_f(a['in_bands'])} bands)"
            )
        for c in data["rank_crossings"]:
            click.echo(
                f"{c['task']}: {' and '.join(c['models'])} change order between "
                f"{' and '.join(c['harnesses'])}"
            )

    _show(ctx, lambda s: contrasts_json(s, harness=harness), render)


@grid_analysis("ladder", "ladder_json")
def ladder_cmd(data: dict[str, Any]) -> None:
    """g per release of each model family, monotonicity, steps beyond band (A11)."""
    for lad in data["ladders"]:
        steps = " -> ".join(f"{r['release']}: {_f(r['g'])}" for r in lad["releases"])
        click.echo(f"{lad['family']} on {lad['task']} ({lad['harness']}): {steps}")
        click.echo(
            f"  monotone: {lad['monotone']}; steps beyond band: {lad['steps_beyond_band']}"
            f"/{len(lad['steps'])}; first to last {_f(lad['first_to_last'])}"
            f" ({'beyond' if lad['first_to_last_beyond_band'] else 'within'} band)"
        )
    if not data["ladders"]:
        click.echo("no family with two or more releases (give --family and --release)")
    for note in data["notes"]:
        click.echo(note)
