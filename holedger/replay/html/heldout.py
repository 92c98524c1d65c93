"""The held-out section: E(H+) of the nominee beside the pinned seed baseline E(H0), each
with its error bar (the standard error of its K round means), g against the resolution
band, and the per-case held-out scores of the nominee beside the baseline's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from holedger.numbers import Mean
from holedger.protocol import rules
from holedger.replay.html.markup import Markup, esc, fmt_score, html_table, section
from holedger.replay.html.plots import PLOT_W, Bar, bar_rows, label, svg
from holedger.replay.html.timeline import Timeline

TITLE = "Held-out score, seed baseline and normalized gain"


def held_out_section(t: Timeline) -> str:
    scored, check, h = t.held_out, t.verification.scores, t.header

    def first(*values: Fraction | None) -> Fraction | None:
        return next((v for v in values if v is not None), None)

    # what the scores check recomputed, else what RunScored says, else the pins
    pin = h.seed_baseline
    e_plus = first(check.e_h_plus if check else None, scored.e_h_plus if scored else None)
    e0 = first(
        check.e_h0 if check else None,
        scored.e_h0 if scored else None,
        Fraction(pin.e_h0) if pin else None,
    )
    g = first(check.g if check else None, scored.g if scored else None)
    terms_band = Fraction(h.terms.resolution_band) if h.terms else None
    band = first(check.band if check else None, terms_band)
    if e_plus is None:
        body = "<p class='muted'>the run was not scored on the held-out split</p>"
        return section("held-out", TITLE, body)
    nominee = scored.per_case if scored else {}
    baseline = t.baseline.per_case if t.baseline else {}
    k = (scored.k if scored else 0) or (h.terms.k if h.terms else 0)
    se_plus = scored.standard_error if scored else None
    se0 = t.baseline.standard_error if t.baseline else None
    bars = [
        Bar("seed harness E(H0)", float(e0 or 0), _bar_text(e0, se0), "seed", se0),
        Bar("nominated E(H+)", float(e_plus), _bar_text(e_plus, se_plus), "nominated", se_plus),
    ]
    outcome = rules.band_outcome(g, band)
    if check is not None and check.band_outcome is not None:
        outcome = check.band_outcome
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
        f"<p>nominated candidate: {esc(t.candidate_index(t.nominated))} "
        f"({esc(t.nominated[:12])})</p>"
        if t.nominated
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


def per_case_table(
    nominee: Mapping[str, Sequence[Fraction]], baseline: Mapping[str, Sequence[Fraction]]
) -> str:
    """Each test case: the nominee's K scores and mean beside the seed baseline's."""
    if not nominee:
        return ""
    rows = []
    classes = []
    for case in sorted(set(nominee) | set(baseline)):
        mine, base = nominee.get(case, ()), baseline.get(case, ())
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
