"""`holedger analysis report`: every cross-run analysis on one self-contained HTML page,
a plot per analysis (inline SVG and CSS; no script, nothing fetched), each with its
readings and the runs it left out. Built from the same dicts as the command line."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from holedger.analysis import suite
from holedger.analysis.sources import Source
from holedger.analysis.svg import Plot, legend

CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:960px;margin:0 auto;padding:16px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 16px;margin:12px 0}
svg{width:100%;height:auto;max-width:640px;display:block}
.band{fill:#999;opacity:.18}.identity{stroke:#555;stroke-dasharray:4,3}
.axis{stroke:#333}.grid{stroke:#eee}.zero{stroke:#888}
.tick{font-size:11px;fill:#444}.caption{font-size:13px;font-weight:bold;fill:#222}.label{font-size:13px;fill:#222}.small{font-size:10px;fill:#333}
.legend .key{margin-right:12px;white-space:nowrap}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.reading,.left{font-size:.85em;color:#555;margin:2px 0}
.warn{background:#fff3cd;border:1px solid #e0c36a;padding:8px;font-weight:bold}
table{border-collapse:collapse;font-size:.85em;margin:6px 0;display:block;overflow-x:auto}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
"""


def _f(value: Any) -> float | None:
    return None if value is None else float(value)


def _notes(data: dict[str, Any]) -> str:
    parts = [f'<p class="reading">reading: {escape(r)}</p>' for r in data.get("readings", [])]
    if data.get("refused"):
        parts.insert(0, f"<p><b>Not computed:</b> {escape(str(data['refused']))}</p>")
    return "".join(parts)


def _range(values: list[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (0.0, 1.0)


def _grid(source: Source) -> str:
    data = suite.grid_json(source)
    out = []
    for task in sorted({c["task"] for c in data["cells"]}):
        cells = [c for c in data["cells"] if c["task"] == task]
        names = [f"{c['model']} / {c['harness']}" for c in cells]
        models = sorted({c["model"] for c in cells})
        obs = [o for o in source.observations if o.task == task and o.g is not None]
        ys = [float(o.g) for o in obs if o.g is not None]
        band = _f(cells[0]["band"]) or 0.0
        plot = Plot(
            f"g per run: {task}",
            "optimizer model / coding harness",
            "normalized gain g",
            (0, 1),
            _range([*ys, band, -band]),
            categories=names,
        )
        plot.hband(-band, band, f"|g| <= band {band:g}: indistinguishable from 0")
        for i, c in enumerate(cells):
            color = models.index(c["model"])
            low, high = _f(c["min_g"]), _f(c["max_g"])
            if low is not None and high is not None:
                plot.vrange(i, low, high, color)
            for o in obs:
                if (o.model, o.harness) == (c["model"], c["harness"]) and o.g is not None:
                    plot.point(
                        i,
                        float(o.g),
                        color,
                        f"{o.run_id or 'table'}: g={float(o.g):.3f}",
                        hollow=c["harness_scope"] == "native",
                    )
        out.append(plot.svg() + legend(models))
    return (
        "".join(out) + '<p class="reading">Filled points: common harness; hollow: native. '
        "Vertical line: min-max range of the cell's runs. Grey band: |g| <= the task's band.</p>"
        + _notes(data)
    )


def _lss(source: Source) -> str:
    data = suite.lss_json(source)
    if data.get("refused"):
        return _notes(data)
    order = [m for tier in data["tiers"] for m in tier]
    values = [_f(data["lambda"][m]) or 0.0 for m in order]
    plot = Plot(
        f"lambda-hat on {data['harness']} ({data['fit']})",
        "optimizer model (tier colour)",
        "lambda-hat (gain units)",
        (0, 1),
        _range([*values, 0.0]),
        categories=order,
    )
    for i, m in enumerate(order):
        tier = next(t for t, ms in enumerate(data["tiers"]) if m in ms)
        plot.vrange(i, 0.0, values[i], tier)
        plot.point(i, values[i], tier, f"{m}: {values[i]:+.3f} (tier {tier + 1})")
    tiers = legend([f"tier {i + 1}: {', '.join(t)}" for i, t in enumerate(data["tiers"])])
    return plot.svg() + tiers + _notes(data)


def _native(source: Source) -> str:
    data = suite.contrasts_json(source)
    pairs = data.get("native_vs_common", [])
    if not pairs:
        return "<p>No (model, task) pair has both a native and a common cell.</p>" + _notes(data)
    xs = [_f(p["common"]) or 0.0 for p in pairs]
    ys = [_f(p["native"]) or 0.0 for p in pairs]
    lo, hi = _range(xs + ys)
    tasks = sorted({p["task"] for p in pairs})
    plot = Plot(
        "native against common harness",
        f"g on {data['reference_common_harness']} (common)",
        "g on the native harness",
        (lo, hi),
        (lo, hi),
    )
    band = sum(_f(p["band"]) or 0.0 for p in pairs) / len(pairs)
    plot.diagonal_band(band)
    for p, x, y in zip(pairs, xs, ys, strict=True):
        plot.point(x, y, tasks.index(p["task"]), f"{p['model']} on {p['task']}: {p['winner']}")
    w = data["wins"]
    summary = (
        f"<p>Common wins {w['common_wins']}, native wins {w['native_wins']}, ties "
        f"{w['ties']}; beyond band {w['beyond_band']}. Model effect "
        f"{_f(data['model_effect']) or 0:.3f}, harness effect "
        f"{_f(data['harness_effect']) or 0:.3f}.</p>"
    )
    return plot.svg() + legend(tasks) + summary + _notes(data)


def _ladder(source: Source) -> str:
    data = suite.ladder_json(source)
    if not data["ladders"]:
        return "<p>No model family with two or more releases in these runs.</p>" + _notes(data)
    longest = max(len(lad["releases"]) for lad in data["ladders"])
    ys = [_f(r["g"]) or 0.0 for lad in data["ladders"] for r in lad["releases"]]
    plot = Plot(
        "release ladder",
        "release (in order within each family)",
        "g",
        (0, 1),
        _range(ys),
        categories=[f"#{i + 1}" for i in range(longest)],
    )
    names = []
    for k, lad in enumerate(data["ladders"]):
        pts = [(float(i), _f(r["g"]) or 0.0) for i, r in enumerate(lad["releases"])]
        plot.polyline(pts, k)
        for (x, y), r in zip(pts, lad["releases"], strict=True):
            plot.point(x, y, k, f"{lad['family']} {r['release']}: {y:+.3f}")
        names.append(
            f"{lad['family']} on {lad['task']} ({lad['monotone']}, "
            f"{lad['steps_beyond_band']} steps beyond band)"
        )
    return plot.svg() + legend(names) + _notes(data)


def _scatter_runs(
    data: dict[str, Any], key: str, title: str, xl: str, yl: str, xkey: str, ykey: str
) -> str:
    rows = data.get(key, [])
    if not rows:
        return "<p>No runs to plot.</p>" + _notes(data)
    xs = [_f(r[xkey]) or 0.0 for r in rows]
    ys = [_f(r[ykey]) or 0.0 for r in rows]
    lo, hi = _range(xs + ys)
    tasks = sorted({r["task"] for r in rows})
    plot = Plot(title, xl, yl, (lo, hi), (lo, hi))
    plot.diagonal_band(0.0)
    for r, x, y in zip(rows, xs, ys, strict=True):
        plot.point(x, y, tasks.index(r["task"]), f"{(r['run_id'] or '')[:8]} {r['model']}")
    return plot.svg() + legend(tasks)


def _optimism(source: Source) -> str:
    data = suite.optimism_json(source)
    if data.get("refused"):
        return _notes(data)
    body = _scatter_runs(
        data,
        "runs",
        "best val aggregate against held-out E(H+)",
        "best val aggregate seen (v*)",
        "E(H+) on test (y)",
        "val_best",
        "heldout",
    )
    return (
        body
        + (
            f"<p>{data['below_identity']} of {data['of']} runs below the identity line "
            "(test below the best val seen).</p>"
        )
        + _notes(data)
    )


def _frontier(source: Source) -> str:
    data = suite.frontier_json(source)
    if data.get("refused"):
        return _notes(data)
    if not data["tasks"]:
        return "<p>No run has metered optimizer tokens.</p>" + _notes(data)
    out = []
    for task, pts in data["tasks"].items():
        xs = [float(p["tokens"]) for p in pts]
        ys = [_f(p["g"]) or 0.0 for p in pts]
        plot = Plot(
            f"token frontier: {task}",
            "optimizer tokens (log scale)",
            "g",
            _range(xs),
            _range(ys),
            xlog=True,
        )
        front = [(x, y) for p, x, y in zip(pts, xs, ys, strict=True) if p["on_frontier"]]
        plot.polyline(sorted(front), 1, dash=True)
        for p, x, y in zip(pts, xs, ys, strict=True):
            plot.point(
                x,
                y,
                1 if p["on_frontier"] else 0,
                f"{p['model']}: {p['tokens']} tokens",
                hollow=not p["on_frontier"],
            )
        out.append(plot.svg())
    return "".join(out) + legend(["off the frontier", "on the frontier"]) + _notes(data)


def _budget(source: Source) -> str:
    data = suite.budget_json(source)
    if data.get("refused"):
        return _notes(data)
    rows = data["runs"]
    if not rows:
        return "<p>No runs.</p>" + _notes(data)
    plot = Plot(
        "budget use per run",
        "call usage (dev + val calls / limit)",
        "case-pass usage (passes / allowance)",
        (0, 1),
        (0, 1),
    )
    plot.diagonal_band(0.0)
    for r in rows:
        scope = 0 if r["harness_scope"] == "common" else 1
        plot.point(
            _f(r["call_usage"]) or 0.0,
            _f(r["pass_usage"]) or 0.0,
            scope,
            f"{(r['run_id'] or '')[:8]}: binds first {r['binds_first']}",
        )
    summary = (
        f"<p>Median call usage {_f(data['median_call_usage']) or 0:.2f}, median case-pass "
        f"usage {_f(data['median_pass_usage']) or 0:.2f}; exhausted {data['exhausted']} of "
        f"{len(rows)}; binds first: "
        + escape(", ".join(f"{k} {v}" for k, v in data["binds_first"].items()))
        + ".</p>"
    )
    return plot.svg() + legend(["common", "native"]) + summary + _notes(data)


def _breadth(source: Source) -> str:
    from holedger.analysis.suite import levers_json

    data = levers_json(source)
    if data.get("refused"):
        return _notes(data)
    rows = [r for r in data["runs"] if r.get("g") is not None]
    missing = len(data.get("trees_missing", []))
    if not rows:
        return (
            f"<p>No run's candidate trees are at hand ({missing} runs without them: the "
            "home's candidate repositories or the bundles' git objects are needed).</p>"
            + _notes(data)
        )
    tasks = sorted({r["task"] for r in rows})
    ys = [_f(r["g"]) or 0.0 for r in rows]
    axis = "levers examined or modified (of 8)"
    plot = Plot("lever breadth against g", axis, "g", (0, 8), _range(ys))
    for r, y in zip(rows, ys, strict=True):
        plot.point(
            float(len(r["levers_touched"])),
            y,
            tasks.index(r["task"]),
            f"{(r['run_id'] or '')[:8]} {r['model']}: {r['edits']} edits",
        )
    return plot.svg() + legend(tasks) + _notes(data)


def _capabilities(source: Source) -> str:
    """Heat maps of the capability grids (C3-C5): the held-out grids of the source's search
    runs and, apart, the in-situ grids of solve-evolve runs; one source per map."""
    from holedger.analysis.heatmap import heatmap
    from holedger.analysis.updating import analyse
    from holedger.analysis.updating_io import grids_from_gains

    out = []
    held_out: list[dict[str, Any]] = []
    if source.origin != "table":
        grids, _ = grids_from_gains(source.scored.values())
        held_out = [analyse(g) for g in grids]
    for title, results in (
        ("held-out scores of search runs (J = E(H+), Base = E(H0))", held_out),
        (
            "in-situ pass rates of solve-evolve runs (Base from the stream's NONE run)",
            source.in_situ,
        ),
    ):
        if results is None:
            continue
        out.append(f"<h3>{escape(title)}</h3>")
        if not results:
            out.append("<p>No grid from this source.</p>")
        for result in results:
            out.append(f"<p><b>{escape(str(result['benchmark']))}</b></p>{heatmap(result)}")
            out.append(_notes(result))
    out.append(
        '<p class="reading">cells: J and delta = J - Base in points; green above Base, red '
        "below (red border: a regression cell), white a tie; * marks the anchors; benefit "
        "is the max over the anchor evolvers, updating the mean over the anchor agents</p>"
    )
    return "".join(out)


SECTIONS: list[tuple[str, str, Callable[[Source], str]]] = [
    ("grid", "g per run by model and harness (A6)", _grid),
    ("lss", "LSS-lambda with its tiers (A7)", _lss),
    ("contrasts", "Native against common harness (A8, A9)", _native),
    ("ladder", "Release ladder (A11)", _ladder),
    ("levers", "Lever breadth against g (A12)", _breadth),
    ("optimism", "Best val against held-out (A16)", _optimism),
    ("frontier", "Optimizer tokens against g (A17)", _frontier),
    ("budget", "Budget use (A14)", _budget),
    ("capabilities", "Harness-updating against harness-benefit (C3-C5)", _capabilities),
]


def render_report(source: Source, path: Path) -> list[str]:
    """Write the page; returns the section names written."""
    head = source.header_json()
    top = []
    if source.first_line:
        top.append(f'<p class="warn">{escape(source.first_line)}</p>')
    else:
        state = (
            "replayed: only runs that verify are counted"
            if source.verified
            else "NOT replayed: runs are counted without verification"
        )
        top.append(
            f"<p>Read from the {escape(source.origin)}; {state}. "
            f"{len(source.observations)} runs in the grid.</p>"
        )
    for item in head["runs_left_out"]:
        top.append(f'<p class="left">left out: {escape(item["run"])}: {escape(item["why"])}</p>')
    body = []
    for name, title, render in SECTIONS:
        body.append(f'<section id="{name}"><h2>{escape(title)}</h2>{render(source)}</section>')
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>holedger: cross-run analyses</title>"
        f"<style>{CSS}</style></head><body><main><h1>Cross-run analyses</h1>"
        + "".join(top)
        + "".join(body)
        + "</main></body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return [name for name, _, _ in SECTIONS]
