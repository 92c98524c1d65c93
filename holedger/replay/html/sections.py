"""The report's sections, each a function of the replay report and the run's data."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from holedger.replay.html.data import CandidateRow, RunData, as_fraction
from holedger.replay.html.markup import (
    esc,
    fmt_num,
    fmt_score,
    generic,
    html_table,
    records_table,
)
from holedger.replay.html.plots import PLOT_W, bar_rows, progress_plot, svg, tokens_plot
from holedger.replay.report import ReplayReport, counted

_SPLIT_ORDER = {"dev": 0, "val": 1, "test": 2}


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>'


def verdict_section(report: ReplayReport, data: RunData) -> str:
    ok = report.verified
    badge = (
        '<p class="verdict ok">VERIFIED (aborted: closed without a score)</p>'
        if ok and report.aborted
        else '<p class="verdict ok">VERIFIED</p>'
        if ok
        else '<p class="verdict bad">VERIFICATION FAILED</p>'
    )
    rows = []
    for check in report.checks:
        state = "ok" if check.ok else ("FAIL" if check.level == "error" else "WARN")
        rows.append(
            f'<tr class="{state.lower()}"><td>{state}</td><td>{esc(check.name)}</td>'
            f"<td>{esc(check.detail)}</td></tr>"
        )
    checks = (
        "<table><thead><tr><th></th><th>check</th><th>detail</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    failures = ""
    if report.failures:
        frows: list[list[Any]] = [
            ["-" if f.seq is None else f.seq, f.type or "-", f.check, f.reason]
            for f in report.failures
        ]
        columns = ["seq", "type", "check", "reason"]
        failures = "<h3>First failures</h3>" + html_table(columns, frows[:10])
        if len(frows) > 10:
            failures += (
                f"<details><summary>{len(frows) - 10} more listed</summary>"
                f"{html_table(columns, frows[10:])}</details>"
            )
        if report.failures_total > len(report.failures):
            failures += f"<p class='muted'>{report.failures_total - len(report.failures)} more</p>"
    facts = html_table(
        ["", ""],
        [
            ["run", report.run_id],
            ["task", data.task_id],
            ["optimizer", data.optimizer],
            ["events", report.events],
            ["opened", data.opened_at],
            ["closed", data.closed_at or "not closed"],
            ["gateway calls", f"{data.gateway_calls} ({data.gateway_denied} denied)"],
            ["replay command", f"holedger replay {report.run_id}"],
        ],
        cls="facts",
    )
    trust = report.sections.get("trust")
    trust_html = ""
    if isinstance(trust, dict):
        trust_html = (
            f"<p class='muted'>keys: {esc(trust.get('source', '?'))}: "
            + esc("; ".join(str(k) for k in trust.get("keys", [])))
            + "</p>"
        )
    return _section(
        "verdict", "Replay verdict and checks", badge + facts + checks + failures + trust_html
    )


def budget_section(report: ReplayReport, data: RunData) -> str:
    table_rows = report.sections.get("budget_table")
    parts = []
    if isinstance(table_rows, list) and table_rows and isinstance(table_rows[0], dict):
        bars = []
        for row in table_rows:
            pct = as_fraction(str(row.get("percent", "")).rstrip("%").strip() or None)
            used, limit = row.get("used"), row.get("limit")
            if pct is None:
                u, lim = as_fraction(used), as_fraction(limit)
                pct = (u / lim * 100) if u is not None and lim else None
            if pct is not None:
                text = f"{fmt_num(used)} / {fmt_num(limit)} ({float(pct):.0f}%)"
                bars.append((str(row.get("component", "?")), float(pct), text, "budget"))
        if bars:
            parts.append(bar_rows(bars, scale=100.0))
        parts.append(records_table(table_rows))
    else:
        parts.append(_budget_fallback(data))
    return _section("budget", "Budget: used and limit per component", "".join(parts))


def _budget_fallback(data: RunData) -> str:
    """Budget use counted from the events when replay gave no budget table."""
    budget = data.terms.get("budget") or {}
    sizes = data.terms.get("split_sizes") or {}
    rows: list[list[Any]] = []
    for split in ("dev", "val"):
        acc = [e for e in data.evaluations if e.split == split and e.decision == "accepted"]
        passes = sum(
            (Fraction(e.cases * e.attempts, int(sizes.get(split) or 1)) for e in acc), Fraction(0)
        )
        limits = budget.get(split) or {}
        rows.append([f"{split} calls", len(acc), limits.get("calls", "?")])
        rows.append([f"{split} case_passes", fmt_num(passes), fmt_num(limits.get("case_passes"))])
    note = "<p class='muted'>counted from the events (replay reported no budget table)</p>"
    return note + html_table(["component", "used", "limit"], rows)


def _changed(cand: CandidateRow) -> str:
    if cand.index == 0 or len(cand.changed) > 8:
        label = "the seed harness" if cand.index == 0 else "files"
        return f"{label} ({len(cand.changed)} files)"
    return ", ".join(cand.changed) or "-"


def candidates_section(data: RunData) -> str:
    per_cand: dict[str, dict[str, list[Fraction]]] = {}
    for ev in data.evaluations:
        if ev.mean is not None:
            per_cand.setdefault(ev.candidate, {}).setdefault(ev.split, []).append(ev.mean)
    rows = []
    for cand in data.candidates:
        results = per_cand.get(cand.commit, {})
        rows.append(
            [
                f"#{cand.index}",
                cand.commit[:12],
                data.candidate_index(cand.parent) if cand.parent else "-",
                _changed(cand),
                " ".join(fmt_score(m) for m in results.get("dev", [])) or "-",
                " ".join(fmt_score(m) for m in results.get("val", [])) or "-",
                "nominated" if cand.commit == data.nominated else "",
            ]
        )
    cand_table = html_table(
        ["candidate", "commit", "parent", "changed paths", "dev means", "val means", ""], rows
    )
    ev_rows = [
        [
            ev.seq,
            ev.request_id,
            data.candidate_index(ev.candidate),
            ev.split,
            f"{ev.cases} x {ev.attempts}",
            ev.decision + (f" ({ev.reason})" if ev.reason else ""),
            fmt_score(ev.mean),
            ev.tokens,
        ]
        for ev in data.evaluations
    ]
    ev_table = html_table(
        ["seq", "request", "candidate", "split", "cases x attempts", "decision", "mean", "tokens"],
        ev_rows,
    )
    body = (
        progress_plot(data)
        + "<h3>Candidates</h3>"
        + cand_table
        + "<h3>Evaluation requests</h3>"
        + ev_table
    )
    return _section("candidates", "Candidates: dev and val results over time", body)


def tokens_section(data: RunData) -> str:
    by_split: dict[str, list[int]] = {}
    for trial in data.trials:
        by_split.setdefault(trial.split, []).append(trial.tokens)
    rows = [
        [split, len(v), sum(v), round(sum(v) / len(v)) if v else 0, max(v) if v else 0]
        for split, v in sorted(by_split.items(), key=lambda kv: _SPLIT_ORDER.get(kv[0], 9))
    ]
    table = html_table(["split", "trials", "tokens", "mean per trial", "max"], rows)
    return _section("tokens", "Tokens per trial", tokens_plot(data) + table)


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
        return _section(
            "held-out",
            "Held-out score, seed baseline and normalized gain",
            "<p class='muted'>the run was not scored on the held-out split</p>",
        )
    bars = [
        ("seed harness E(H0)", float(e0 or 0), fmt_score(e0), "seed"),
        ("nominated E(H+)", float(e_plus), fmt_score(e_plus), "nominated"),
    ]
    above = g is not None and band is not None and g > band
    if isinstance(scores, dict) and isinstance(scores.get("exceeds_band"), bool):
        above = bool(scores["exceeds_band"])
    g_text = (
        f"<p class='big'>g = {fmt_score(g)} "
        f"<span class='{'ok' if above else 'bad'}'>"
        f"{'above' if above else 'not above'} the resolution band {fmt_score(band)}</span></p>"
    )
    g_plot = ""
    if g is not None:
        g_plot = _g_plot(g, band)
    explain = (
        "<p class='muted'>g = (E(H+) - E(H0)) / (1 - E(H0)): the share of the seed's headroom "
        f"that the nominated candidate won, each test case scored K = "
        f"{esc(scored.get('k', data.terms.get('k', '?')))} times. E(H0) is the task's pinned "
        "seed baseline.</p>"
    )
    per_case = scored.get("per_case") or []
    table = ""
    if per_case:
        table = (
            "<details><summary>per-case held-out scores</summary>"
            + html_table(
                ["case", "scores"],
                [
                    [c.get("case_id"), " ".join(fmt_score(s) for s in c.get("scores", []))]
                    for c in per_case
                ],
            )
            + "</details>"
        )
    nominated = (
        f"<p>nominated candidate: {esc(data.candidate_index(data.nominated))} "
        f"({esc(data.nominated[:12])})</p>"
        if data.nominated
        else ""
    )
    body = nominated + bar_rows(bars) + g_text + g_plot + explain + table
    return _section("held-out", "Held-out score, seed baseline and normalized gain", body)


def _g_plot(g: Fraction, band: Fraction | None) -> str:
    """g on a [-1, 1] line with the resolution band shaded around 0."""
    x0, x1, y = 40, PLOT_W - 40, 30

    def xpos(v: float) -> float:
        return x0 + (x1 - x0) * (max(-1.0, min(1.0, v)) + 1) / 2

    out = [f'<line class="axis" x1="{x0}" y1="{y}" x2="{x1}" y2="{y}"/>']
    if band is not None:
        bx0, bx1 = xpos(-float(band)), xpos(float(band))
        out.append(
            f'<rect class="band" x="{bx0:.1f}" y="{y - 14}" width="{bx1 - bx0:.1f}" height="28">'
            f"<title>resolution band +/- {fmt_score(band)}</title></rect>"
        )
    for v in (-1, -0.5, 0, 0.5, 1):
        out.append(
            f'<text class="tick" x="{xpos(v):.1f}" y="{y + 30}" text-anchor="middle">{v}</text>'
        )
    out.append(
        f'<circle class="gmark" cx="{xpos(float(g)):.1f}" cy="{y}" r="7">'
        f"<title>g = {fmt_score(g)}</title></circle>"
    )
    return svg("".join(out), height=70, label="normalized gain and resolution band")


def safety_section(report: ReplayReport, data: RunData) -> str:
    safety = report.sections.get("safety")
    parts = []
    if isinstance(safety, dict):
        parts.append(
            f"<p>{esc(counted(int(safety.get('violations', 0)), 'safety violation'))} over "
            f"{esc(counted(int(safety.get('trials', len(data.trials))), 'trial'))}; "
            f"{esc(counted(int(safety.get('unisolated_trials', 0)), 'trial'))} ran without "
            "isolation"
            + (
                f"; {esc(counted(int(safety['not_run_trials']), 'trial'))} recorded as not run"
                if safety.get("not_run_trials")
                else ""
            )
            + ".</p>"
        )
        by_cat = safety.get("by_category") or {}
        if by_cat:
            top = max(int(v) for v in by_cat.values())
            parts.append(
                bar_rows(
                    [(k, float(v), str(v), "safety") for k, v in by_cat.items()], scale=float(top)
                )
            )
        parts.append(records_table(list(safety.get("listed") or [])))
    else:
        parts.append(records_table(data.safety))
    backends = sorted({f"{t.backend} ({t.isolation})" for t in data.trials})
    if backends:
        parts.append(f"<p class='muted'>sandbox backends: {esc(', '.join(backends))}</p>")
    return _section("safety", "Safety", "".join(parts))


def leakage_section(report: ReplayReport) -> str:
    leakage = report.sections.get("leakage")
    checks = [c for c in report.checks if c.name in ("leakage", "candidate_scan")]

    def cls(ok: bool, detail: str) -> str:
        return "bad" if not ok else ("warnline" if "skipped" in detail else "ok")

    head = "".join(
        f"<p class='{cls(c.ok, c.detail)}'><b>{esc(c.name)}</b>: {esc(c.detail)}</p>"
        for c in checks
    )
    if not isinstance(leakage, dict):
        body = head + "<p class='muted'>replay reported no leakage audit for this run</p>"
        return _section("leakage", "Leakage audit", body)
    parts = [head]
    for part, title in (
        ("audit", "What the optimizer was shown"),
        ("candidate_scan", "Committed candidates"),
    ):
        info = leakage.get(part)
        if isinstance(info, dict):
            status = info.get("status", "?")
            reason = f": {info['reason']}" if info.get("reason") else ""
            findings = info.get("findings") or []
            parts.append(
                f"<h3>{esc(title)}</h3><p>{esc(status)}{esc(reason)}; {len(findings)} findings</p>"
            )
            if findings:
                parts.append(records_table(findings))
    shown = leakage.get("shown")
    if isinstance(shown, list):
        parts.append(
            f"<details><summary>{counted(len(shown), 'projection')} shown to the optimizer, by "
            f"digest</summary>{records_table(shown)}</details>"
        )
    rules = leakage.get("rules")
    if isinstance(rules, dict):
        text = ", ".join(f"{k} {v}" for k, v in rules.items())
        parts.append(f"<p class='muted'>matching rules: {esc(text)}</p>")
    skip = ("audit", "candidate_scan", "shown", "rules")
    rest = {k: v for k, v in leakage.items() if k not in skip}
    if rest:
        parts.append(generic(rest))
    return _section("leakage", "Leakage audit", "".join(parts))


def other_sections(report: ReplayReport) -> str:
    shown = {"budget_table", "safety", "scores", "leakage", "trust"}
    rest = {k: v for k, v in report.sections.items() if k not in shown}
    if not rest:
        return ""
    parts = [f"<h3>{esc(name)}</h3>{generic(value)}" for name, value in rest.items()]
    return _section("more", "Other replay sections", "".join(parts))
