"""The HTML report of one run: a single self-contained page, readable offline.

Everything is inline: the CSS in a ``<style>`` element and every plot as inline SVG. The
page loads nothing: no script, no font, no image, no stylesheet from anywhere, so it can
be mailed, archived, or opened on an air-gapped machine.

What it shows comes from two places. The verdict, the checks and the projections'
sections (budget table, scores, leakage audit, safety) come from the replay report, so
the page says exactly what ``holedger replay`` says. The timeline of evaluations and the
tokens per trial are read from the run's stored events (parsed leniently: a damaged
record is skipped here, and the replay verdict at the top names it).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from holedger.ledger.store import Ledger
from holedger.replay.report import ReplayReport, counted

SECTION_IDS = (
    "verdict",
    "budget",
    "candidates",
    "tokens",
    "held-out",
    "safety",
    "leakage",
)
"""The ``id`` of every section the page always holds, in page order."""

PLOT_W = 760
_SPLIT_ORDER = {"dev": 0, "val": 1, "test": 2}
PLOT_H = 240


# --------------------------------------------------------------------------- data


@dataclass
class EvaluationRow:
    """One evaluation request and what its trials scored."""

    seq: int
    request_id: str
    candidate: str
    split: str
    cases: int
    attempts: int
    decision: str
    reason: str | None
    scores: list[Fraction] = field(default_factory=list)
    tokens: int = 0

    @property
    def mean(self) -> Fraction | None:
        return sum(self.scores, Fraction(0)) / len(self.scores) if self.scores else None


@dataclass
class TrialRow:
    seq: int
    trial_id: str
    candidate: str
    split: str
    case_id: str
    score: Fraction
    tokens: int
    wall_ms: int
    backend: str
    isolation: str


@dataclass
class CandidateRow:
    seq: int
    index: int
    commit: str
    parent: str | None
    changed: list[str]
    immutable_ok: bool


@dataclass
class RunData:
    """What the page needs from a run's events (read leniently, in seq order)."""

    run_id: str
    task_id: str = "?"
    optimizer: str = "?"
    opened_at: str = "?"
    closed_at: str | None = None
    terms: dict[str, Any] = field(default_factory=dict)
    seed_baseline: dict[str, Any] | None = None
    candidates: list[CandidateRow] = field(default_factory=list)
    evaluations: list[EvaluationRow] = field(default_factory=list)
    trials: list[TrialRow] = field(default_factory=list)
    gateway_calls: int = 0
    gateway_denied: int = 0
    safety: list[dict[str, Any]] = field(default_factory=list)
    nominated: str | None = None
    scored: dict[str, Any] | None = None
    closed_summary: dict[str, Any] | None = None
    unreadable: int = 0

    def candidate_index(self, commit: str) -> str:
        for cand in self.candidates:
            if cand.commit == commit:
                return f"#{cand.index}"
        return commit[:8]


def _frac(value: Any) -> Fraction | None:
    if value is None:
        return None
    try:
        return Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        return None


def collect_run(ledger: Ledger, run_id: str) -> RunData:
    """Fold the stored events of ``run_id`` into the page's data (no verification here)."""
    records: list[tuple[int, dict[str, Any]]] = []
    data = RunData(run_id)
    for _, raw in ledger.raw_records(run_id):
        try:
            rec = json.loads(raw)
            records.append((int(rec["seq"]), rec))
        except (ValueError, KeyError, TypeError):
            data.unreadable += 1
    return fold_records(run_id, (rec for _, rec in sorted(records, key=lambda r: r[0])), data)


def fold_records(
    run_id: str, records: Iterable[dict[str, Any]], data: RunData | None = None
) -> RunData:
    """Fold parsed record objects (envelope + payload) into a RunData."""
    data = data or RunData(run_id)
    by_request: dict[str, EvaluationRow] = {}
    for rec in records:
        try:
            _fold_one(data, by_request, rec)
        except (KeyError, TypeError, ValueError):
            data.unreadable += 1
    return data


def _fold_one(data: RunData, by_request: dict[str, EvaluationRow], rec: dict[str, Any]) -> None:
    etype = rec["type"]
    seq = int(rec["seq"])
    p: dict[str, Any] = rec.get("payload") or {}
    if etype == "RunOpened":
        data.task_id = str(p.get("task_id", "?"))
        data.optimizer = str(p.get("optimizer", "?"))
        data.opened_at = str(rec.get("time", "?"))
        data.terms = dict(p.get("terms") or {})
        data.seed_baseline = p.get("seed_baseline")
    elif etype == "CandidateCommitted":
        data.candidates.append(
            CandidateRow(
                seq,
                int(p["index"]),
                str(p["candidate"]),
                p.get("parent"),
                list(p.get("changed_paths") or []),
                bool(p.get("immutable_ok", True)),
            )
        )
    elif etype == "EvaluationRequested":
        row = EvaluationRow(
            seq,
            str(p["request_id"]),
            str(p["candidate"]),
            str(p["split"]),
            len(p.get("case_ids") or []),
            int(p.get("attempts", 1)),
            str(p.get("decision", "?")),
            p.get("reason"),
        )
        by_request[row.request_id] = row
        data.evaluations.append(row)
    elif etype == "TrialCompleted":
        tokens = int((p.get("tokens") or {}).get("total", 0))
        score = _frac(p.get("score")) or Fraction(0)
        trial = TrialRow(
            seq,
            str(p["trial_id"]),
            str(p["candidate"]),
            str(p["split"]),
            str(p["case_id"]),
            score,
            tokens,
            int(p.get("wall_ms", 0)),
            str(p.get("backend", "?")),
            str(p.get("isolation", "?")),
        )
        data.trials.append(trial)
        request = by_request.get(str(p.get("request_id")))
        if request is not None:
            request.scores.append(score)
            request.tokens += tokens
    elif etype == "GatewayCall":
        data.gateway_calls += 1
        if not p.get("allowed", True):
            data.gateway_denied += 1
    elif etype == "SafetyViolation":
        data.safety.append({"seq": seq, **p})
    elif etype == "CandidateNominated":
        data.nominated = str(p["candidate"])
    elif etype == "RunScored":
        data.scored = dict(p)
    elif etype == "RunClosed":
        data.closed_at = str(rec.get("time", "?"))
        data.closed_summary = dict(p.get("summary") or {})


# --------------------------------------------------------------------------- formatting


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt_num(value: Any, digits: int = 3) -> str:
    """A rational or number as a short decimal; anything else as text."""
    frac = value if isinstance(value, Fraction) else _frac(value)
    if frac is None:
        return "-" if value is None else str(value)
    if frac.denominator == 1:
        return str(frac.numerator)
    return f"{float(frac):.{digits}f}"


def fmt_score(value: Any) -> str:
    """A score, mean, gain or band, always to three decimals (``0.000`` beside ``0.333``,
    never ``0``); ``-`` when there is none."""
    frac = value if isinstance(value, Fraction) else _frac(value)
    if frac is None:
        return "-" if value is None else str(value)
    return f"{float(frac):.3f}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        text = json.dumps(value, sort_keys=True, default=str)
        return esc(text if len(text) <= 200 else text[:197] + "...")
    return esc(value)


def html_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    klass = f' class="{esc(cls)}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _records_table(items: Sequence[dict[str, Any]], limit: int = 200) -> str:
    if not items:
        return "<p class='muted'>none</p>"
    columns: list[str] = []
    for item in items[:limit]:
        for key in item:
            if key not in columns:
                columns.append(key)
    rows = [[item.get(c, "") for c in columns] for item in items[:limit]]
    more = f"<p class='muted'>... {len(items) - limit} more</p>" if len(items) > limit else ""
    return html_table(columns, rows) + more


def _generic(value: Any) -> str:
    """Any JSON-shaped section as nested definition lists and tables."""
    if isinstance(value, dict):
        if not value:
            return "<p class='muted'>empty</p>"
        parts = []
        for key, item in value.items():
            parts.append(f"<dt>{esc(key)}</dt><dd>{_generic(item)}</dd>")
        return "<dl>" + "".join(parts) + "</dl>"
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return _records_table(value)
        if not value:
            return "<span class='muted'>none</span>"
        return esc(", ".join(str(v) for v in value))
    return _cell(value)


# --------------------------------------------------------------------------- plots


def _svg(body: str, width: int = PLOT_W, height: int = PLOT_H, label: str = "") -> str:
    return (
        f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{esc(label)}">{body}</svg>'
    )


def _axes(x0: int, y0: int, x1: int, y1: int, ymax: float, yfmt: str = "{:.2f}") -> str:
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
    out = [_axes(x0, y0, x1, y1, 1.0)]

    def ypos(v: float) -> float:
        return y1 - (y1 - y0) * v

    baseline = _frac((data.seed_baseline or {}).get("e_h0"))
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
    return _svg("".join(out), label="dev and val results over time") + legend


def tokens_plot(data: RunData) -> str:
    """Total target tokens of every trial, in order, coloured by split."""
    trials = data.trials
    if not trials:
        return "<p class='muted'>no trials</p>"
    x0, y0, x1, y1 = 64, 16, PLOT_W - 16, PLOT_H - 30
    top = max(max(t.tokens for t in trials), 1)
    step = (x1 - x0) / len(trials)
    width = max(step * 0.85, 0.6)
    out = [_axes(x0, y0, x1, y1, float(top), "{:,.0f}")]
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
    return _svg("".join(out), label="tokens per trial") + legend


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
    return _svg("".join(out), height=height, label="bars")


# --------------------------------------------------------------------------- sections


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>'


def verdict_section(report: ReplayReport, data: RunData) -> str:
    ok = report.verified
    badge = (
        '<p class="verdict ok">VERIFIED</p>'
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
            pct = _frac(str(row.get("percent", "")).rstrip("%").strip() or None)
            used, limit = row.get("used"), row.get("limit")
            if pct is None:
                u, lim = _frac(used), _frac(limit)
                pct = (u / lim * 100) if u is not None and lim else None
            if pct is not None:
                text = f"{fmt_num(used)} / {fmt_num(limit)} ({float(pct):.0f}%)"
                bars.append((str(row.get("component", "?")), float(pct), text, "budget"))
        if bars:
            parts.append(bar_rows(bars, scale=100.0))
        parts.append(_records_table(table_rows))
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
    e_plus = _frac(src.get("e_h_plus"))
    e0 = _frac(src.get("e_h0")) or _frac((data.seed_baseline or {}).get("e_h0"))
    g = _frac(src.get("g"))
    band = _frac(src.get("resolution_band")) or _frac(data.terms.get("resolution_band"))
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
    return _svg("".join(out), height=70, label="normalized gain and resolution band")


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
        parts.append(_records_table(list(safety.get("listed") or [])))
    else:
        parts.append(_records_table(data.safety))
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
                parts.append(_records_table(findings))
    shown = leakage.get("shown")
    if isinstance(shown, list):
        parts.append(
            f"<details><summary>{counted(len(shown), 'projection')} shown to the optimizer, by "
            f"digest</summary>{_records_table(shown)}</details>"
        )
    rules = leakage.get("rules")
    if isinstance(rules, dict):
        text = ", ".join(f"{k} {v}" for k, v in rules.items())
        parts.append(f"<p class='muted'>matching rules: {esc(text)}</p>")
    skip = ("audit", "candidate_scan", "shown", "rules")
    rest = {k: v for k, v in leakage.items() if k not in skip}
    if rest:
        parts.append(_generic(rest))
    return _section("leakage", "Leakage audit", "".join(parts))


def other_sections(report: ReplayReport) -> str:
    shown = {"budget_table", "safety", "scores", "leakage", "trust"}
    rest = {k: v for k, v in report.sections.items() if k not in shown}
    if not rest:
        return ""
    parts = [f"<h3>{esc(name)}</h3>{_generic(value)}" for name, value in rest.items()]
    return _section("more", "Other replay sections", "".join(parts))


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 color:#1d2433;background:#f6f7f9}
main{max-width:980px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:0 0 12px}h3{font-size:15px}
section{background:#fff;border:1px solid #dfe3ea;border-radius:8px;padding:16px 20px;
 margin:16px 0}
table{border-collapse:collapse;width:100%;margin:8px 0;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceff4;vertical-align:top}
th{background:#f1f3f7}
table.facts td:first-child{width:140px;color:#5b6577}
tr.fail td{background:#fdecec}tr.warn td{background:#fff7e0}
.verdict{font-size:20px;font-weight:700;padding:6px 12px;border-radius:6px;display:inline-block}
.verdict.ok{background:#e3f6e8;color:#17692f}.verdict.bad{background:#fdecec;color:#a11a1a}
.ok{color:#17692f}.bad{color:#a11a1a}.warnline{color:#8a5a00}.muted{color:#5b6577}.big{font-size:17px}
svg.plot{max-width:100%;height:auto;display:block}
.axis{stroke:#8a93a3;stroke-width:1}.grid{stroke:#eceff4;stroke-width:1}
.tick,.reflabel,.blabel,.bval{font-size:11px;fill:#5b6577}.blabel{fill:#1d2433}
.pt.dev{fill:#2f6fdb}.pt.val{fill:#e07b24}
.trend{stroke-width:1.5;fill:none}.trend.dev{stroke:#2f6fdb}.trend.val{stroke:#e07b24}
.ref.seed{stroke:#7d8796;stroke-dasharray:5 4}
.bar.dev{fill:#2f6fdb}.bar.val{fill:#e07b24}.bar.test{fill:#7b4fc9}
.bar.seed{fill:#9aa3b2}.bar.nominated{fill:#1f9d55}.bar.budget{fill:#2f6fdb}
.bar.safety{fill:#d64545}.track{fill:#f1f3f7}
.band{fill:#fde9c8}.gmark{fill:#1f9d55;stroke:#fff;stroke-width:2}
.legend{font-size:12px;color:#5b6577}
.sw{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;border-radius:2px}
.sw.dev{background:#2f6fdb}.sw.val{background:#e07b24}.sw.test{background:#7b4fc9}
.sw.seed{background:#7d8796}
dl{margin:4px 0}dt{font-weight:600;margin-top:6px}dd{margin:2px 0 0 16px}
nav a{margin-right:12px;color:#2f6fdb;text-decoration:none}
details{margin:8px 0}
"""


def render_html(data: RunData, report: ReplayReport) -> str:
    """The whole page as one string."""
    nav = "".join(
        f'<a href="#{sid}">{esc(name)}</a>'
        for sid, name in (
            ("verdict", "verdict"),
            ("budget", "budget"),
            ("candidates", "candidates"),
            ("tokens", "tokens"),
            ("held-out", "held-out score"),
            ("safety", "safety"),
            ("leakage", "leakage"),
        )
    )
    state = "verified" if report.verified else "FAILED verification"
    body = "".join(
        [
            verdict_section(report, data),
            budget_section(report, data),
            candidates_section(data),
            tokens_section(data),
            held_out_section(report, data),
            safety_section(report, data),
            leakage_section(report),
            other_sections(report),
        ]
    )
    unreadable = (
        f"<p class='bad'>{data.unreadable} stored records could not be read for the plots</p>"
        if data.unreadable
        else ""
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>holedger run {esc(report.run_id)}</title>"
        f"<style>{CSS}</style></head><body><main>"
        f"<header><h1>holedger run report</h1><p class='muted'>run {esc(report.run_id)} on "
        f"task {esc(data.task_id)}: {esc(state)}. This page is self-contained: it loads "
        "nothing from anywhere.</p><nav>"
        f"{nav}</nav></header>{unreadable}{body}"
        "<footer><p class='muted'>Re-derive everything on this page from the signed log with "
        f"<code>holedger replay {esc(report.run_id)}</code>.</p></footer>"
        "</main></body></html>\n"
    )


def build_report(ledger: Ledger, run_id: str, report: ReplayReport) -> str:
    """The HTML page of ``run_id`` given its replay report."""
    return render_html(collect_run(ledger, run_id), report)


def write_report(ledger: Ledger, run_id: str, report: ReplayReport, path: Path) -> Path:
    """Render the page and write it to ``path`` (parents created); return the path."""
    page = build_report(ledger, run_id, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
