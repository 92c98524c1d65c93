"""The report's plots, as inline SVG (no script, nothing fetched).

Each chart shows one split only (dev, val and test are never on one chart), and every
label fits its chart: a label too long for its room is shortened with an ellipsis and
given whole in the element's tooltip (``<title>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from holedger.replay.html.markup import esc, fmt_score
from holedger.replay.html.timeline import Evaluation, Timeline, Trial

PLOT_W = 760
PLOT_H = 240
CHAR_W = 6.6  # the widest average advance of an 11px sans-serif character, in px


def svg(body: str, width: int = PLOT_W, height: int = PLOT_H, label: str = "") -> str:
    return (
        f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{esc(label)}">{body}</svg>'
    )


def fit(text: str, width: float) -> str:
    """``text`` shortened with an ellipsis to fit ``width`` px at the tick font size."""
    room = max(int(width / CHAR_W), 1)
    return text if len(text) <= room else text[: max(room - 1, 0)] + "…"


def label(x: float, y: float, text: str, width: float, anchor: str, cls: str = "tick") -> str:
    """A text label that fits ``width`` px; the whole text in its tooltip when shortened."""
    shown = fit(text, width)
    title = f"<title>{esc(text)}</title>" if shown != text else ""
    return (
        f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">'
        f"{title}{esc(shown)}</text>"
    )


def axes(x0: int, y0: int, x1: int, y1: int, ymax: float, yfmt: str = "{:.2f}") -> str:
    """Left and bottom axes with four horizontal grid lines from 0 to ymax."""
    out = [f'<line class="axis" x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}"/>']
    out.append(f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>')
    for i in range(5):
        value = ymax * i / 4
        y = y1 - (y1 - y0) * i / 4
        out.append(f'<line class="grid" x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>')
        out.append(label(x0 - 6, y + 4, yfmt.format(value), x0 - 8, "end"))
    return "".join(out)


def error_bar(x: float, y_low: float, y_high: float, cls: str = "err") -> str:
    """A vertical error bar with caps, from y_low to y_high (SVG y grows downwards)."""
    return (
        f'<path class="{cls}" d="M{x:.1f} {y_low:.1f}V{y_high:.1f}'
        f'M{x - 4:.1f} {y_low:.1f}h8M{x - 4:.1f} {y_high:.1f}h8"/>'
    )


def split_mean_plot(data: Timeline, split: str) -> str:
    """The mean score of each scored evaluation request on ``split``, in request order,
    with the standard error of its per-case means as an error bar."""
    points = [e for e in data.evaluations if e.split == split and e.mean is not None]
    if not points:
        return f"<p class='muted'>no {esc(split)} evaluation was scored</p>"
    x0, y0, x1, y1 = 48, 16, PLOT_W - 16, PLOT_H - 36
    step = (x1 - x0) / len(points)
    out = [axes(x0, y0, x1, y1, 1.0)]

    def ypos(v: float) -> float:
        return y1 - (y1 - y0) * max(0.0, min(v, 1.0))

    prev: tuple[float, float] | None = None
    for i, ev in enumerate(points):
        assert ev.mean is not None
        x, y = x0 + step * (i + 0.5), ypos(float(ev.mean))
        se = ev.standard_error
        if se is not None and se > 0:
            m = float(ev.mean)
            out.append(error_bar(x, ypos(m - se), ypos(m + se)))
        if prev is not None:
            out.append(
                f'<line class="trend {split}" x1="{prev[0]:.1f}" y1="{prev[1]:.1f}" '
                f'x2="{x:.1f}" y2="{y:.1f}"/>'
            )
        prev = (x, y)
        tip = _point_tip(data, ev, se)
        if split == "dev":
            out.append(
                f'<circle class="pt dev" cx="{x:.1f}" cy="{y:.1f}" r="5"><title>{esc(tip)}</title>'
                "</circle>"
            )
        else:
            out.append(
                f'<rect class="pt {esc(split)}" x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" '
                f'height="10"><title>{esc(tip)}</title></rect>'
            )
        out.append(label(x, y1 + 14, data.candidate_index(ev.candidate), step - 2, "middle"))
    out.append(
        label(
            (x0 + x1) / 2,
            PLOT_H - 4,
            f"{split} evaluations in request order (label: candidate); bars: ±1 standard error",
            x1 - x0,
            "middle",
        )
    )
    return svg("".join(out), label=f"{split} mean score per evaluation")


def _point_tip(data: Timeline, ev: Evaluation, se: float | None) -> str:
    bar = "" if se is None else f", standard error {se:.3f}"
    return (
        f"{ev.split} request {ev.request_id}: candidate {data.candidate_index(ev.candidate)}, "
        f"{len(ev.by_case)} cases, {len(ev.scores)} trials, mean {fmt_score(ev.mean)}{bar}"
    )


def tokens_plot(trials: Sequence[Trial], split: str) -> str:
    """Total target tokens of every trial of one split, in order."""
    if not trials:
        return f"<p class='muted'>no {esc(split)} trials</p>"
    x0, y0, x1, y1 = 64, 16, PLOT_W - 16, PLOT_H - 30
    top = max(max(t.tokens for t in trials), 1)
    step = (x1 - x0) / len(trials)
    width = max(step * 0.85, 0.6)
    out = [axes(x0, y0, x1, y1, float(top), "{:,.0f}")]
    for i, trial in enumerate(trials):
        h = (y1 - y0) * trial.tokens / top
        x = x0 + step * i
        out.append(
            f'<rect class="bar {esc(split)}" x="{x:.2f}" y="{y1 - h:.2f}" '
            f'width="{width:.2f}" height="{h:.2f}"><title>{esc(trial.trial_id)} '
            f"(case {esc(trial.case_id)}): {trial.tokens} tokens, "
            f"score {fmt_score(trial.score)}</title></rect>"
        )
    out.append(
        label((x0 + x1) / 2, PLOT_H - 6, f"{len(trials)} {split} trials in order", x1, "middle")
    )
    return svg("".join(out), label=f"tokens per {split} trial")


@dataclass(frozen=True)
class Bar:
    """One horizontal bar: its label, value in [0, scale], the text shown after it, its
    css class, and an optional error bar (± that much, in the value's units)."""

    label: str
    value: float
    text: str
    cls: str
    error: float | None = None


def bar_rows(rows: Sequence[Bar], scale: float = 1.0, label_w: int = 200) -> str:
    """Horizontal bars with labels that fit their room and optional error bars."""
    height = 28 * len(rows) + 12
    x0, x1 = label_w, PLOT_W - 150
    out = []

    def xpos(v: float) -> float:
        return x0 + (x1 - x0) * max(0.0, min(v / scale if scale else 0.0, 1.0))

    for i, row in enumerate(rows):
        y = 8 + 28 * i
        out.append(label(x0 - 8, y + 15, row.label, x0 - 12, "end", "blabel"))
        out.append(f'<rect class="track" x="{x0}" y="{y}" width="{x1 - x0}" height="20"/>')
        w = xpos(row.value) - x0
        out.append(
            f'<rect class="bar {esc(row.cls)}" x="{x0}" y="{y}" width="{w:.1f}" height="20"/>'
        )
        if row.error:
            lo, hi = xpos(row.value - row.error), xpos(row.value + row.error)
            out.append(
                f'<path class="err" d="M{lo:.1f} {y + 10}H{hi:.1f}M{lo:.1f} {y + 4}v12'
                f'M{hi:.1f} {y + 4}v12"><title>±{row.error:.3f} (standard error)</title></path>'
            )
        out.append(label(x1 + 8, y + 15, row.text, PLOT_W - x1 - 10, "start", "bval"))
    return svg("".join(out), height=height, label="bars")
