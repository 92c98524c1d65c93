"""Inline SVG plots for the analysis report: axes with ticks and labels, points, ranges,
lines, shaded bands, on a linear or a log axis. Text is escaped; nothing is scripted."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH = 640
LEFT, RIGHT, TOP = 64, 16, 30
PLOT_HEIGHT = 252  # the data area
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if raw <= mult * step:
            step *= mult
            break
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


@dataclass
class Plot:
    """One chart: call the drawing methods in data coordinates, then :meth:`svg`."""

    title: str
    xlabel: str
    ylabel: str
    xrange: tuple[float, float]
    yrange: tuple[float, float]
    xlog: bool = False
    categories: Sequence[str] = ()  # a categorical x axis: x is the index
    parts: list[str] = field(default_factory=list)

    def _pad(self) -> None:
        lo, hi = self.yrange
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        pad = (hi - lo) * 0.08
        self.yrange = (lo - pad, hi + pad)
        if not self.categories and not self.xlog:
            lo, hi = self.xrange
            if hi - lo < 1e-9:
                lo, hi = lo - 0.5, hi + 0.5
            pad = (hi - lo) * 0.08
            self.xrange = (lo - pad, hi + pad)

    def __post_init__(self) -> None:
        if self.xlog:
            lo, hi = self.xrange
            self.xrange = (math.log10(max(lo, 1)) - 0.1, math.log10(max(hi, 1)) + 0.1)
        if self.categories:
            self.xrange = (-0.5, len(self.categories) - 0.5)
        self._pad()

    @property
    def bottom(self) -> int:
        """Room under the data area: rotated category names need more."""
        if not self.categories:
            return 56
        longest = max(len(name[:28]) for name in self.categories)
        return 44 + int(longest * 3.6)

    @property
    def height(self) -> int:
        return TOP + PLOT_HEIGHT + self.bottom

    def x(self, value: float) -> float:
        if self.xlog:
            value = math.log10(max(value, 1))
        lo, hi = self.xrange
        return LEFT + (value - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        lo, hi = self.yrange
        return TOP + (hi - value) / (hi - lo) * (PLOT_HEIGHT)

    def point(
        self, x: float, y: float, color: int = 0, label: str = "", hollow: bool = False
    ) -> None:
        fill = "none" if hollow else PALETTE[color % len(PALETTE)]
        self.parts.append(
            f'<circle cx="{self.x(x):.1f}" cy="{self.y(y):.1f}" r="4" fill="{fill}" '
            f'stroke="{PALETTE[color % len(PALETTE)]}" stroke-width="1.5">'
            f"<title>{escape(label)}</title></circle>"
        )

    def vrange(self, x: float, low: float, high: float, color: int = 0) -> None:
        self.parts.append(
            f'<line x1="{self.x(x):.1f}" x2="{self.x(x):.1f}" y1="{self.y(low):.1f}" '
            f'y2="{self.y(high):.1f}" stroke="{PALETTE[color % len(PALETTE)]}" stroke-width="2"/>'
        )

    def hbar(self, y: float, value: float, color: int = 0, label: str = "") -> None:
        x0, x1 = sorted((self.x(0), self.x(value)))
        self.parts.append(
            f'<rect x="{x0:.1f}" y="{self.y(y) - 9:.1f}" width="{max(x1 - x0, 1):.1f}" height="18" '
            f'fill="{PALETTE[color % len(PALETTE)]}"><title>{escape(label)}</title></rect>'
        )

    def polyline(
        self, points: Sequence[tuple[float, float]], color: int = 0, dash: bool = False
    ) -> None:
        coords = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in points)
        style = ' stroke-dasharray="5,4"' if dash else ""
        self.parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{PALETTE[color % len(PALETTE)]}" '
            f'stroke-width="1.5"{style}/>'
        )

    def hband(self, low: float, high: float, label: str = "") -> None:
        """A shaded horizontal band (|g| <= b about 0, say)."""
        lo, hi = max(low, self.yrange[0]), min(high, self.yrange[1])
        if hi <= lo:
            return
        self.parts.append(
            f'<rect class="band" x="{LEFT}" y="{self.y(hi):.1f}" width="{WIDTH - LEFT - RIGHT}" '
            f'height="{self.y(lo) - self.y(hi):.1f}"><title>{escape(label)}</title></rect>'
        )

    def diagonal_band(self, band: float) -> None:
        """The identity line y = x and the strip |y - x| <= band around it."""
        lo = max(self.xrange[0], self.yrange[0])
        hi = min(self.xrange[1], self.yrange[1])
        if hi <= lo:
            return
        poly = [(lo, lo - band), (hi, hi - band), (hi, hi + band), (lo, lo + band)]
        coords = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in poly)
        self.parts.append(f'<polygon class="band" points="{coords}"/>')
        self.parts.append(
            f'<line class="identity" x1="{self.x(lo):.1f}" y1="{self.y(lo):.1f}" '
            f'x2="{self.x(hi):.1f}" y2="{self.y(hi):.1f}"/>'
        )

    def text(self, x: float, y: float, words: str) -> None:
        self.parts.append(
            f'<text x="{self.x(x) + 6:.1f}" y="{self.y(y) - 6:.1f}" class="small">'
            f"{escape(words)}</text>"
        )

    def svg(self) -> str:
        out = [
            f'<svg viewBox="0 0 {WIDTH} {self.height}" role="img" '
            f'aria-label="{escape(self.title)}" xmlns="http://www.w3.org/2000/svg">',
            f"<title>{escape(self.title)}</title>",
            f'<text x="{LEFT}" y="18" class="caption">{escape(self.title)}</text>',
        ]
        for t in _nice_ticks(*self.yrange):
            if self.yrange[0] <= t <= self.yrange[1]:
                out.append(
                    f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{self.y(t):.1f}" '
                    f'y2="{self.y(t):.1f}"/><text x="{LEFT - 6}" y="{self.y(t) + 4:.1f}" '
                    f'text-anchor="end" class="tick">{t:g}</text>'
                )
        if self.categories:
            for i, name in enumerate(self.categories):
                out.append(
                    f'<text class="tick" text-anchor="end" transform="translate({self.x(i):.1f},'
                    f'{TOP + PLOT_HEIGHT + 12}) rotate(-30)">{escape(name[:28])}</text>'
                )
        else:
            ticks = _log_ticks(*self.xrange) if self.xlog else _nice_ticks(*self.xrange)
            for t in ticks:
                if self.xrange[0] <= t <= self.xrange[1]:
                    label = f"{10**t:,.0f}" if self.xlog else f"{t:g}"
                    out.append(
                        f'<text x="{self.x(10**t if self.xlog else t):.1f}" '
                        f'y="{TOP + PLOT_HEIGHT + 16}" text-anchor="middle" class="tick">'
                        f"{label}</text>"
                    )
        out.append(
            f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + PLOT_HEIGHT}"/>'
            f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + PLOT_HEIGHT}" '
            f'y2="{TOP + PLOT_HEIGHT}"/>'
        )
        if self.yrange[0] < 0 < self.yrange[1]:
            out.append(
                f'<line class="zero" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{self.y(0):.1f}" '
                f'y2="{self.y(0):.1f}"/>'
            )
        out.extend(self.parts)
        out.append(
            f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{self.height - 8}" '
            f'text-anchor="middle" class="label">{escape(self.xlabel)}</text>'
            f'<text transform="translate(14,{(TOP + TOP + PLOT_HEIGHT) / 2:.0f}) rotate(-90)" '
            f'text-anchor="middle" class="label">{escape(self.ylabel)}</text></svg>'
        )
        return "".join(out)


def _log_ticks(low: float, high: float) -> list[float]:
    """Exponents of 1, 2 and 5 times the powers of ten between ``low`` and ``high``
    (log10 units); powers of ten alone when they are enough."""
    powers = [float(e) for e in range(math.floor(low), math.ceil(high) + 1) if low <= e <= high]
    if len(powers) >= 2:
        return powers
    out = []
    for e in range(math.floor(low), math.ceil(high) + 1):
        for m in (1, 2, 5):
            t = e + math.log10(m)
            if low <= t <= high:
                out.append(t)
    return out


def legend(names: Sequence[str]) -> str:
    """An HTML legend of colour swatches, in palette order."""
    items = "".join(
        f'<span class="key"><span class="swatch" style="background:{PALETTE[i % len(PALETTE)]}">'
        f"</span>{escape(name)}</span>"
        for i, name in enumerate(names)
    )
    return f'<p class="legend">{items}</p>'
