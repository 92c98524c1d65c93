"""The held-out section: E(H+) of the nominee beside the pinned seed baseline E(H0), each
with its error bar (the standard error of its K round means), g against the resolution
band, and the per-case held-out scores of the nominee beside the baseline's."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from holedger.numbers import Mean
from holedger.protocol import rules
from holedger.replay.html.data import RunData, as_fraction, per_case_scores
from holedger.replay.html.markup import Markup, esc, fmt_score, html_table, section
from holedger.replay.html.plots import PLOT_W, Bar, bar_rows, label, svg
from holedger.replay.html.stats import held_out_standard_error
from holedger.replay.report import ReplayReport

TITLE = "Held-out score, seed baseline and normalized gain"


def held_out_section(report: ReplayReport, data: RunData) -> str:
    scores = report.sections.get("scores")
    scored = data.scored or {}
    src: dict[str, Any] = dict(scored)
    if isinstance(scores, dict):
        src.update({k: v for k, v in scores.items() if v is not None})
    e_plus = as_fraction(src.get("e_h_plus"))
    e0 = as_fraction(src.get("e_h0")) or as_fraction((data.seed_baseline or {}).get("e_h0"))
    g = as_fraction(src.get("g"))
    band = as_fraction(src.get("resolution_band")) or as_fraction(data.terms.get("resolution_band"))
    if e_plus is None:
        body = "<p class='muted'>the run was not scored on the held-out split</p>"
        return section("held-out", TITLE, body)
    nominee = per_case_scores(scored)
    baseline = data.baseline_per_case or {}
    k = int(scored.get("k") or data.terms.get("k") or 0)
    se_plus, se0 = held_out_standard_error(nominee), held_out_standard_error(baseline)
    bars = [
        Bar("seed harness E(H0)", float(e0 or 0), _bar_text(e0, se0), "seed", se0),
        Bar("nominated E(H+)", float(e_plus), _bar_text(e_plus, se_plus), "nominated", se_plus),
    ]
    outcome = rules.band_outcome(g, band)
    if isinstance(scores, dict) and isinstance(scores.get("band_outcome"), str):
        outcome = str(scores["band_outcome"])
    cls = {rules.RESOLVED_GAIN: "ok", rules.RESOLVED_LOSS: "bad"}.get(outcome or "", "muted")
    g_text = (
        f"<p class='big'>g = {fmt_score(g)} <span class='{cls}'>"
        f"{esc(rules.band_outcome_text(outcome, fmt_score(band)))}</span></p>"
    )
    counts = ""
    if nominee and k:
        counts = f"<p>E(H+) {esc(Mean.of(e_plus, len(nominee), k).text())}"
        if e0 is not None:
            counts += f"; E(H0) {esc(Mean.of(e0, len(nominee), k).text())}"
        counts += "</p>"
    explain = (
        "<p class='muted'>g = (E(H+) - E(H0)) / (1 - E(H0)): the share of the seed's headroom "
        f"that the nominated candidate won, each test case scored K = {esc(k or '?')} times. "
        "E(H0) is the task's pinned seed baseline. Error bars: ±1 standard error of the K "
        "round means (round r = attempt r over all cases), not the spread across cases"
        + (
            ""
            if se0 is not None
            else "; the baseline run's per-case scores are not in this "
            "ledger, so E(H0) has no error bar here"
        )
        + ".</p>"
    )
    nominated = (
        f"<p>nominated candidate: {esc(data.candidate_index(data.nominated))} "
        f"({esc(data.nominated[:12])})</p>"
        if data.nominated
        else ""
    )
    body = (
        nominated
        + bar_rows(bars)
        + counts
        + g_text
        + (g_plot(g, band) if g is not None else "")
        + explain
        + per_case_table(nominee, baseline)
    )
    return section("held-out", TITLE, body)


def _bar_text(value: Fraction | None, se: float | None) -> str:
    return fmt_score(value) + ("" if se is None else f" ± {se:.3f}")


def per_case_table(nominee: dict[str, list[Fraction]], baseline: dict[str, list[Fraction]]) -> str:
    """Each test case: the nominee's K scores and mean beside the seed baseline's."""
    if not nominee:
        return ""
    rows = []
    classes = []
    for case in sorted(set(nominee) | set(baseline)):
        mine, base = nominee.get(case, []), baseline.get(case, [])
        m_mean = sum(mine, Fraction(0)) / len(mine) if mine else None
        b_mean = sum(base, Fraction(0)) / len(base) if base else None
        delta = None if m_mean is None or b_mean is None else m_mean - b_mean
        rows.append(
            [
                case,
                " ".join(fmt_score(s) for s in mine) or "-",
                fmt_score(m_mean),
                " ".join(fmt_score(s) for s in base) or "-",
                fmt_score(b_mean),
                Markup(
                    "-" if delta is None else esc(("+" if delta > 0 else "") + fmt_score(delta))
                ),
            ]
        )
        classes.append("" if delta is None or delta == 0 else ("up" if delta > 0 else "down"))
    note = (
        ""
        if baseline
        else (
            "<p class='muted'>the seed baseline's per-case scores: its baseline run is not in "
            "this ledger</p>"
        )
    )
    table = html_table(
        ["test case", "nominee scores", "nominee mean", "seed scores", "seed mean", "difference"],
        rows,
        cls="cases",
        row_classes=classes,
    )
    return (
        "<details open><summary>per-case held-out scores, nominee beside the seed baseline"
        f"</summary>{note}{table}</details>"
    )


def g_plot(g: Fraction, band: Fraction | None) -> str:
    """g on a [-1, 1] line with the resolution band shaded around 0."""
    x0, x1, y = 40, PLOT_W - 40, 30

    def xpos(v: float) -> float:
        return x0 + (x1 - x0) * (max(-1.0, min(1.0, v)) + 1) / 2

    out = [f'<line class="axis" x1="{x0}" y1="{y}" x2="{x1}" y2="{y}"/>']
    if band is not None:
        bx0, bx1 = xpos(-float(band)), xpos(float(band))
        out.append(
            f'<rect class="band" x="{bx0:.1f}" y="{y - 14}" width="{bx1 - bx0:.1f}" height="28">'
            f"<title>resolution band ± {fmt_score(band)}</title></rect>"
        )
    for v in (-1, -0.5, 0, 0.5, 1):
        out.append(label(xpos(v), y + 30, str(v), 60, "middle"))
    out.append(
        f'<circle class="gmark" cx="{xpos(float(g)):.1f}" cy="{y}" r="7">'
        f"<title>g = {fmt_score(g)}</title></circle>"
    )
    return svg("".join(out), height=70, label="normalized gain and resolution band")
