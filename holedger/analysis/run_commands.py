"""The analyses that read more of each run than its g: `holedger analysis budget`,
`tokens`, `optimism`, `frontier`, `trace` and `bands`, and `holedger analysis report`
(every analysis on one self-contained HTML page)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from holedger.analysis.grid_commands import _f, _grid_sources, grid_analysis, load_source
from holedger.analysis.group import analysis_group
from holedger.output import console, emit_json, plain, settings, table

WHO = ["run", "task", "model", "harness"]


def _who(row: dict[str, Any]) -> list[Any]:
    """The columns that say whose run a row is: run id (short), task, model, harness."""
    return [(row["run_id"] or "")[:8], row["task"], row["model"], row["harness"]]


@grid_analysis("budget", "budget_json")
def budget_cmd(data: dict[str, Any]) -> None:
    """Budget use per run, medians, exhaustion by scope and task, and which component
    binds first (A14)."""
    rows = [
        [
            *_who(r),
            _f(r["call_usage"], False),
            _f(r["pass_usage"], False),
            ",".join(r["exhausted_splits"]) or "-",
            r["binds_first"],
        ]
        for r in data["runs"]
    ]
    heads = [*WHO, "calls", "passes", "exhausted", "binds first"]
    console().print(table("budget use", heads, rows))
    click.echo(
        f"median call usage {_f(data['median_call_usage'], False)}, median case-pass "
        f"usage {_f(data['median_pass_usage'], False)}; exhausted {data['exhausted']}"
        f"/{len(data['runs'])}"
    )
    click.echo(f"exhausted by scope: {data['exhausted_by_scope']}")
    click.echo(f"exhausted by task: {data['exhausted_by_task']}")
    click.echo(f"binds first: {data['binds_first']}")


@grid_analysis("tokens", "tokens_json")
def tokens_cmd(data: dict[str, Any]) -> None:
    """Target-model tokens (search and held-out) and optimizer tokens beside g (A15)."""
    rows = [
        [
            *_who(r),
            _f(r["g"]),
            r["target_tokens_search"],
            r["target_tokens_heldout"],
            r["optimizer_tokens"].get("total", 0),
        ]
        for r in data["runs"]
    ]
    heads = [*WHO, "g", "target search", "target test", "optimizer"]
    console().print(table("tokens", heads, rows))
    for task, rho in data["spearman_target_tokens_g"].items():
        click.echo(
            f"{task}: Spearman rho(target tokens, g) = {'-' if rho is None else f'{rho:+.3f}'}"
        )


@grid_analysis("optimism", "optimism_json")
def optimism_cmd(data: dict[str, Any]) -> None:
    """Best val aggregate seen against held-out E(H+), runs below the identity (A16)."""
    rows = [
        [
            *_who(r),
            _f(r["val_best"], False),
            _f(r["heldout"], False),
            _f(r["optimism"]),
        ]
        for r in data["runs"]
    ]
    heads = [*WHO, "best val", "E(H+) test", "optimism"]
    console().print(table("val-best against held-out", heads, rows))
    click.echo(
        f"below the identity (test < best val): {data['below_identity']}/{data['of']}; "
        f"mean optimism {_f(data['mean_optimism'])}"
    )


@grid_analysis("frontier", "frontier_json")
def frontier_cmd(data: dict[str, Any]) -> None:
    """The Pareto frontier of optimizer tokens against g, per task (A17)."""
    for task, pts in data["tasks"].items():
        rows = [
            [
                p["run_id"][:8],
                p["model"],
                p["harness"],
                p["tokens"],
                _f(p["g"]),
                "frontier" if p["on_frontier"] else p["label"],
            ]
            for p in pts
        ]
        heads = ["run", "model", "harness", "optimizer tokens", "g", ""]
        console().print(table(f"{task}: tokens against g", heads, rows))
    if not data["tasks"]:
        click.echo("no run has metered optimizer tokens")


@grid_analysis("bands", "bands_json")
def bands_cmd(data: dict[str, Any]) -> None:
    """Per task: the resolution band parameter beside b_t derived from paired re-scorings
    of nominees, and the gains the band cannot tell from 0 (|g| <= b) (A5)."""
    rows = [
        [
            t["task"],
            _f(t["band_parameter"], False),
            "-" if t["band_from_rescorings"] is None else f"{t['band_from_rescorings']:.3f}",
            t["rescorings"],
            t["observations"],
            "-" if t["indistinguishable_from_zero"] is None else t["indistinguishable_from_zero"],
            "-" if t["resolved_from_zero"] is None else t["resolved_from_zero"],
        ]
        for t in data["tasks"]
    ]
    heads = ["task", "band", "from re-scorings", "pairs", "g values", "|g| <= b", "|g| > b"]
    console().print(table("resolution bands", heads, rows))
    click.echo(data["rescorings_note"])
    for item in data["rescorings_left_out"]:
        click.echo(f"re-scoring left out: {item['run'][:8]}: {item['why']}")


@grid_analysis("levers", "levers_json")
def levers_cmd(data: dict[str, Any]) -> None:
    """Levers each run's candidates modified, breadth, total edits, and per task
    Spearman rho(breadth, g) (A12)."""
    rows = [
        [
            *_who(r),
            _f(r["g"]),
            f"{len(r['levers_touched'])}/8",
            "-" if r["breadth_examined"] is None else f"{r['breadth_examined']}/8",
            r["edits"],
            ", ".join(r["levers_modified"]) or "-",
        ]
        for r in data["runs"]
    ]
    heads = [*WHO, "g", "breadth", "examined", "edits", "levers modified"]
    console().print(table("lever breadth", heads, rows, fold=("levers modified",)))
    for task, rho in data["spearman_breadth_g"].items():
        shown = "-" if rho is None else f"{rho:+.3f}"
        click.echo(f"{task}: Spearman rho(breadth, g) = {shown}")
    for item in data["trees_missing"]:
        click.echo(f"no trees: {item['run'][:8]}: {item['why']}")
    click.echo(data["examined_note"])


@grid_analysis("trace", "trace_json")
def trace_cmd(data: dict[str, Any]) -> None:
    """Trace-reading share and deep-fetch counts (A13), from the optimizer's recorded reads."""
    rows = [
        [
            *_who(r),
            _f(r["g"]),
            r["actions"],
            r["output_reads"],
            r["trace_fetches"],
            _f(r["share"], False),
        ]
        for r in data["runs"]
    ]
    heads = [*WHO, "g", "actions", "output reads", "trace fetches", "share"]
    console().print(table("trace reading", heads, rows))
    for task, rho in data["spearman_share_g"].items():
        shown = "-" if rho is None else f"{rho:+.3f}"
        click.echo(f"{task}: Spearman rho(trace-reading share, g) = {shown}")
    click.echo(
        f"deep fetches: {data['deep_fetches']} in total; {data['cells_with_deep_fetch']} of "
        f"{data['cells']} cells fetched a trace at least once"
    )
    for item in data["runs_without_reads"]:
        click.echo(f"{(item['run'] or '')[:8]}: {item['why']}")


@analysis_group.command("report")
@_grid_sources
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the page.",
)
@click.pass_context
def report_cmd(ctx: click.Context, /, output: Path, **_: Any) -> None:
    """Every analysis on one self-contained HTML page (inline SVG and CSS, no script)."""
    from holedger.analysis.report import render_report

    p = ctx.params
    source = load_source(
        ctx, p["task_id"], p["bundles"], p["table_path"], p["bands"], p["verify"], p["trusted"]
    )
    if source.origin == "ledger":  # solve-evolve runs of the same ledger, their own grids
        source.in_situ = _in_situ_grids(ctx, p["task_id"], bool(source.verified), p["trusted"])
    sections = render_report(source, output)
    if p["as_json"]:
        emit_json({**source.header_json(), "report": str(output), "sections": sections})
        return
    if source.first_line:
        click.echo(source.first_line)
    console().print(plain(f"report written to {output} ({len(sections)} sections)"), soft_wrap=True)


def _in_situ_grids(
    ctx: click.Context, task_id: str | None, verify: bool, trusted: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The analysed in-situ grids of the home's solve-evolve runs (replayed with verify)."""
    from holedger.analysis.insitu import grids_from_ledger
    from holedger.analysis.updating import analyse
    from holedger.ledger.keys import load_trusted_keys
    from holedger.ledger.store import Ledger

    ledger = Ledger.open(settings(ctx).ledger_url, None, create_tables=False)
    try:
        grids, _, _ = grids_from_ledger(
            ledger, task_id=task_id, verify=verify, trusted_keys=load_trusted_keys(list(trusted))
        )
    finally:
        ledger.close()
    return [analyse(g) for g in grids]
