"""Heat maps of the capability grids (C3-C5) for the analysis report: inline SVG.

One map per grid (one benchmark, one source): a row per agent, the NONE column (Base) then
a column per evolver. Each evolver cell shows J and delta = J - Base in points (%p) and is
coloured by delta: green above Base, red below, the deeper the larger |delta| against the
grid's largest; a tie with NONE is white, a regression cell (strictly below NONE) has a
red border, a missing cell is grey with "-". Anchors are marked with *. The row and column
ends give harness-benefit (the max over the anchor evolvers) and harness-updating (the
mean over the anchor agents). Every cell carries a <title> with its exact values.
"""

from __future__ import annotations

from fractions import Fraction
from html import escape
from typing import Any

CELL_W, CELL_H, LABEL_W, HEAD_H = 92, 34, 190, 46


def _pts(value: Fraction | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    points = float(value) * 100
    return f"{points:+.1f}" if signed else f"{points:.1f}"


def _colour(delta: Fraction, scale: Fraction) -> str:
    """White at 0; towards green (above) or red (below) in proportion to |delta| / scale."""
    share = min(1.0, float(abs(delta) / scale)) if scale else 0.0
    low = round(255 - 150 * share)
    if delta > 0:
        return f"rgb({low},{round(255 - 60 * share)},{low})"
    if delta < 0:
        return f"rgb({round(255 - 40 * share)},{low},{low})"
    return "rgb(255,255,255)"


def _short(name: str, limit: int = 24) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def heatmap(result: dict[str, Any]) -> str:
    """The SVG of one grid, from :func:`holedger.analysis.updating.analyse`'s result."""
    agents: list[str] = list(result["agents"])
    evolvers: list[str] = list(result["evolvers"])
    anchors = result["anchors"]
    base = {b["agent"]: b["base"] for b in result["base"]}
    cells = {(c["agent"], c["evolver"]): c for c in result["cells"]}
    benefit = {b["agent"]: b["benefit"] for b in result["benefit"]}
    updating = {u["evolver"]: u["updating"] for u in result["updating"]}
    deltas = [c["delta"] for c in cells.values() if c.get("delta") is not None]
    scale = max((abs(d) for d in deltas), default=Fraction(0))
    columns = ["NONE", *evolvers, "benefit (max)"]
    width = LABEL_W + CELL_W * len(columns) + 8
    height = HEAD_H + CELL_H * (len(agents) + 1) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(result["benchmark"])}: J and delta per agent and '
        'evolver">'
    ]

    def text(x: float, y: float, words: str, cls: str = "small", anchor: str = "middle") -> None:
        parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}" text-anchor="{anchor}">'
            f"{escape(words)}</text>"
        )

    for i, name in enumerate(columns):
        x = LABEL_W + CELL_W * i + CELL_W / 2
        star = " *" if name in anchors["evolvers"] else ""
        parts.append(f"<g><title>{escape(name)}</title>")
        text(x, HEAD_H - 8, _short(name, 14) + star, "label")
        parts.append("</g>")
    for r, agent in enumerate(agents):
        y = HEAD_H + CELL_H * r
        star = " *" if agent in anchors["agents"] else ""
        text(LABEL_W - 6, y + CELL_H / 2 + 4, _short(agent) + star, "label", "end")
        for i, name in enumerate(columns):
            x = LABEL_W + CELL_W * i
            fill, stroke, lines, title = "rgb(238,238,238)", "#ccc", ["-"], f"{agent} x {name}"
            if name == "NONE":
                b = base.get(agent)
                lines = [f"Base {_pts(b)}"]
                title += f": Base {b}"
            elif name == "benefit (max)":
                v = benefit.get(agent)
                fill, lines, title = "rgb(250,250,250)", [_pts(v, True) + " %p"], title + f": {v}"
            elif (agent, name) in cells:
                cell = cells[agent, name]
                delta = cell.get("delta")
                lines = [f"J {_pts(cell['j'])}", f"{_pts(delta, True)} %p"]
                title += f": J {cell['j']}, delta {delta}"
                if delta is not None:
                    fill = _colour(delta, scale)
                    stroke = "#b00" if delta < 0 else "#999"
            parts.append(
                f'<g><title>{escape(title)}</title><rect x="{x + 1}" y="{y + 1}" '
                f'width="{CELL_W - 2}" height="{CELL_H - 2}" fill="{fill}" stroke="{stroke}"/>'
            )
            for k, line in enumerate(lines):
                offset = CELL_H / 2 + 4 + (k - (len(lines) - 1) / 2) * 12
                text(x + CELL_W / 2, y + offset, line)
            parts.append("</g>")
    y = HEAD_H + CELL_H * len(agents)
    text(LABEL_W - 6, y + CELL_H / 2 + 4, "updating (mean)", "label", "end")
    for i, evolver in enumerate(evolvers, start=1):
        value = updating.get(evolver)
        x = LABEL_W + CELL_W * i + CELL_W / 2
        parts.append(f"<g><title>updating of {escape(evolver)}: {value}</title>")
        text(x, y + CELL_H / 2 + 4, _pts(value, True) + " %p")
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)
