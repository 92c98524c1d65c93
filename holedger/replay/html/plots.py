"""The report's plots, as inline SVG (no script, nothing fetched)."""

from __future__ import annotations

from collections.abc import Sequence

from holedger.replay.html.data import RunData, as_fraction
from holedger.replay.html.markup import esc, fmt_score

PLOT_W = 760
PLOT_H = 240


def svg(body: str, width: int = PLOT_W, height: int = PLOT_H, label: str = "") -> str:
    return (
        f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{esc(label)}">{body}</svg>'
    )


def axes(x0: int, y0: int, x1: int, y1: int, ymax: float, yfmt: str = "{:.2f}") -> str:
    """Left and bottom axes with four horizontal grid lines from 0 to ymax."""
    out = [f'<line class="axis" x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}"/>']
    out.append(f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>')
    for i in range(5):
        value = ymax * i / 4
        y = y1 - (y1 - y0) * i / 4
        out.append(f'<line class="grid" x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="tick" x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{esc(yfmt.format(value))}</text>"
        )
    return "".join(out)


def progress_plot(data: RunData) -> str:
    """Dev and val mean score of each accepted evaluation, in request order."""
    points = [e for e in data.evaluations if e.mean is not None and e.split in ("dev", "val")]
    if not points:
        return "<p class='muted'>no dev or val evaluation was scored</p>"
    x0, y0, x1, y1 = 48, 16, PLOT_W - 16, PLOT_H - 36
    n = len(points)
    step = (x1 - x0) / max(n, 1)
    out = [axes(x0, y0, x1, y1, 1.0)]

    def ypos(v: float) -> float:
        return y1 - (y1 - y0) * v

    baseline = as_fraction((data.seed_baseline or {}).get("e_h0"))
    if baseline is not None:
        y = ypos(float(baseline))
        out.append(f'<line class="ref seed" x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="reflabel" x="{x1 - 4}" y="{y - 4:.1f}" text-anchor="end">'
            f"seed E(H0) on test {fmt_score(baseline)}</text>"
        )
    prev: dict[str, tuple[float, float]] = {}
    for i, ev in enumerate(points):
        assert ev.mean is not None
        x = x0 + step * (i + 0.5)
        y = ypos(float(ev.mean))
        label = (
            f"{ev.split} request {ev.request_id}: candidate {data.candidate_index(ev.candidate)}, "
            f"{ev.cases} cases x {ev.attempts}, mean {fmt_score(ev.mean)}"
        )
        if ev.split in prev:
            px, py = prev[ev.split]
            out.append(
                f'<line class="trend {ev.split}" x1="{px:.1f}" y1="{py:.1f}" '
                f'x2="{x:.1f}" y2="{y:.1f}"/>'
            )
        prev[ev.split] = (x, y)
        if ev.split == "dev":
            out.append(
                f'<circle class="pt dev" cx="{x:.1f}" cy="{y:.1f}" r="5">'
                f"<title>{esc(label)}</title></circle>"
            )
        else:
            out.append(
                f'<rect class="pt val" x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10">'
                f"<title>{esc(label)}</title></rect>"
            )
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{y1 + 14}" text-anchor="middle">'
            f"{esc(data.candidate_index(ev.candidate))}</text>"
        )
    out.append(
        f'<text class="tick" x="{(x0 + x1) / 2:.0f}" y="{PLOT_H - 4}" text-anchor="middle">'
        "evaluations in request order (label: candidate)</text>"
    )
    legend = (
        '<p class="legend"><span class="sw dev"></span>dev mean (per-case disclosed) '
        '<span class="sw val"></span>val mean (aggregate disclosed) '
        '<span class="sw seed"></span>pinned seed baseline</p>'
    )
    return svg("".join(out), label="dev and val results over time") + legend


def tokens_plot(data: RunData) -> str:
    """Total target tokens of every trial, in order, coloured by split."""
    trials = data.trials
    if not trials:
        return "<p class='muted'>no trials</p>"
    x0, y0, x1, y1 = 64, 16, PLOT_W - 16, PLOT_H - 30
    top = max(max(t.tokens for t in trials), 1)
    step = (x1 - x0) / len(trials)
    width = max(step * 0.85, 0.6)
    out = [axes(x0, y0, x1, y1, float(top), "{:,.0f}")]
    for i, trial in enumerate(trials):
        h = (y1 - y0) * trial.tokens / top
        x = x0 + step * i
        out.append(
            f'<rect class="bar {esc(trial.split)}" x="{x:.2f}" y="{y1 - h:.2f}" '
            f'width="{width:.2f}" height="{h:.2f}"><title>{esc(trial.trial_id)} '
            f"({esc(trial.split)}, case {esc(trial.case_id)}): {trial.tokens} tokens, "
            f"score {fmt_score(trial.score)}</title></rect>"
        )
    out.append(
        f'<text class="tick" x="{(x0 + x1) / 2:.0f}" y="{PLOT_H - 6}" text-anchor="middle">'
        f"{len(trials)} trials in order</text>"
    )
    legend = (
        '<p class="legend"><span class="sw dev"></span>dev <span class="sw val"></span>val '
        '<span class="sw test"></span>test (held-out scoring)</p>'
    )
    return svg("".join(out), label="tokens per trial") + legend


def bar_rows(rows: Sequence[tuple[str, float, str, str]], scale: float = 1.0) -> str:
    """Horizontal bars: (label, value in [0, scale], shown text, css class)."""
    height = 28 * len(rows) + 12
    x0, x1 = 200, PLOT_W - 120
    out = []
    for i, (label, value, text, cls) in enumerate(rows):
        y = 8 + 28 * i
        w = (x1 - x0) * max(0.0, min(value / scale if scale else 0.0, 1.0))
        out.append(
            f'<text class="blabel" x="{x0 - 8}" y="{y + 15}" text-anchor="end">{esc(label)}</text>'
        )
        out.append(f'<rect class="track" x="{x0}" y="{y}" width="{x1 - x0}" height="20"/>')
        out.append(f'<rect class="bar {esc(cls)}" x="{x0}" y="{y}" width="{w:.1f}" height="20"/>')
        out.append(f'<text class="bval" x="{x1 + 8}" y="{y + 15}">{esc(text)}</text>')
    return svg("".join(out), height=height, label="bars")
