"""The report's sections on verification: the verdict and checks, the budget, safety, the
leakage audit, and what else replay checked; each a function of the replay report and
the run's data. Every table names its columns: nothing is a dump of a record's keys."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from holedger.numbers import percent, percent_text
from holedger.replay.html.data import RunData
from holedger.replay.html.markup import columns_table, esc, fmt_num, html_table, section
from holedger.replay.html.plots import Bar, bar_rows
from holedger.replay.report import ReplayReport, counted


def verdict_section(report: ReplayReport, data: RunData) -> str:
    badge = (
        '<p class="verdict ok">VERIFIED (aborted: closed without a score)</p>'
        if report.verified and report.aborted
        else '<p class="verdict ok">VERIFIED</p>'
        if report.verified
        else '<p class="verdict bad">VERIFICATION FAILED</p>'
    )
    states = ["ok" if c.ok else ("FAIL" if c.level == "error" else "WARN") for c in report.checks]
    checks = html_table(
        ["", "check", "detail"],
        [[state, c.name, c.detail] for state, c in zip(states, report.checks, strict=True)],
        cls="checks",
        row_classes=[state.lower() for state in states],
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
            f"<p class='muted wrap'>keys: {esc(trust.get('source', '?'))}: "
            + esc("; ".join(str(k) for k in trust.get("keys", [])))
            + "</p>"
        )
    return section(
        "verdict", "Replay verdict and checks", badge + facts + checks + failures + trust_html
    )


def budget_section(report: ReplayReport, data: RunData) -> str:
    table_rows = report.sections.get("budget_table")
    if not (isinstance(table_rows, list) and table_rows and isinstance(table_rows[0], dict)):
        return section("budget", "Budget: used and limit per component", _budget_fallback(data))
    bars, rows = [], []
    for row in table_rows:
        used, limit = row.get("used"), row.get("limit")
        share = percent(used, limit)
        name = str(row.get("component", "?"))
        rows.append([name, fmt_num(used), fmt_num(limit), percent_text(share)])
        if share is not None:
            bars.append(
                Bar(name, share, f"{fmt_num(used)} of {fmt_num(limit)} ({share:.1f}%)", "budget")
            )
    body = (bar_rows(bars, scale=100.0) if bars else "") + html_table(
        ["component", "used", "limit", "share"], rows
    )
    return section("budget", "Budget: used and limit per component", body)


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


SAFETY_COLUMNS = (
    ("seq", "seq"),
    ("category", "category"),
    ("trial_id", "trial"),
    ("call_id", "call"),
    ("detail", "detail"),
)


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
                    [Bar(str(k), float(v), str(v), "safety") for k, v in by_cat.items()],
                    scale=float(top),
                )
            )
        parts.append(columns_table(list(safety.get("listed") or []), SAFETY_COLUMNS))
    else:
        parts.append(columns_table(data.safety, SAFETY_COLUMNS))
    backends = sorted({f"{t.backend} ({t.isolation})" for t in data.trials})
    if backends:
        parts.append(f"<p class='muted'>sandbox backends: {esc(', '.join(backends))}</p>")
    return section("safety", "Safety", "".join(parts))


SHOWN_COLUMNS = (
    ("seq", "seq"),
    ("request_id", "request"),
    ("split", "split"),
    ("policy", "policy"),
    ("digest", "projection digest"),
)


def _findings_table(part: str, findings: list[dict[str, Any]]) -> str:
    """The audit's findings (a projection shown to the optimizer that holds held-out
    items) or the candidate scan's (a committed file that does)."""
    if part == "audit":
        rows = [
            [f.get("seq"), f.get("request_id"), ", ".join(str(i) for i in f.get("items") or [])]
            for f in findings
        ]
        return html_table(["seq", "request", "held-out items it holds"], rows)
    rows = []
    for f in findings:
        lines = "; ".join(
            f"line {ln.get('line')}: {', '.join(str(m) for m in ln.get('matches') or [])}"
            for ln in f.get("lines") or []
            if isinstance(ln, dict)
        )
        rows.append([f"#{f.get('index')}", f.get("file"), f.get("kind"), f.get("items"), lines])
    return html_table(["candidate", "file", "kind", "items", "where"], rows)


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
        return section("leakage", "Leakage audit", body)
    parts = [head]
    for part, title in (
        ("audit", "What the optimizer was shown"),
        ("candidate_scan", "Committed candidates"),
    ):
        info = leakage.get(part)
        if isinstance(info, dict):
            status = info.get("status", "?")
            reason = f": {info['reason']}" if info.get("reason") else ""
            findings = [f for f in info.get("findings") or [] if isinstance(f, dict)]
            parts.append(
                f"<h3>{esc(title)}</h3><p>{esc(status)}{esc(reason)}; "
                f"{esc(counted(len(findings), 'finding'))}</p>"
            )
            if findings:
                parts.append(_findings_table(part, findings))
    shown = leakage.get("shown")
    if isinstance(shown, list):
        parts.append(
            f"<details><summary>{counted(len(shown), 'projection')} shown to the optimizer, by "
            f"digest</summary>{columns_table(shown, SHOWN_COLUMNS)}</details>"
        )
    rules = leakage.get("rules")
    if isinstance(rules, dict):
        text = ", ".join(f"{k} {v}" for k, v in rules.items())
        parts.append(f"<p class='muted'>matching rules: {esc(text)}</p>")
    return section("leakage", "Leakage audit", "".join(parts))


def more_section(report: ReplayReport) -> str:
    """The other checks' sections in one line each: what they found, in words."""
    lines = []
    baseline = report.sections.get("baseline")
    if isinstance(baseline, dict):
        if baseline.get("checked") is False:
            lines.append(f"seed baseline: not checked ({baseline.get('reason', 'no reason')})")
        else:
            state = "verified" if baseline.get("verified") else "did not verify"
            matches = "matches the pin" if baseline.get("matches") else "does not match the pin"
            lines.append(f"seed baseline run {baseline.get('run_id')}: {state}, {matches}")
    rescored = report.sections.get("rescored")
    if isinstance(rescored, dict):
        reason = f" ({rescored['reason']})" if rescored.get("reason") else ""
        lines.append(f"re-scoring of answers: {rescored.get('status', '?')}{reason}")
    gateway = report.sections.get("gateway")
    if isinstance(gateway, dict):
        target = (gateway.get("target_tokens") or {}).get("total", 0)
        opt = (gateway.get("optimizer_tokens") or {}).get("total", 0)
        lines.append(
            f"gateway: {counted(int(gateway.get('calls', 0)), 'call')}, {target} target tokens "
            f"(cap {gateway.get('target_cap', '-')}), {opt} optimizer tokens, "
            f"overshoot {gateway.get('overshoot', 0)}"
        )
    closed = report.sections.get("closed")
    if isinstance(closed, dict):
        why = f": {closed['why']}" if closed.get("why") else ""
        lines.append(f"run closed: {closed.get('reason', '?')}{why}")
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    note = (
        "<p class='muted'>every section in full: <code>holedger replay "
        f"{esc(report.run_id)} --json</code></p>"
    )
    return section("more", "Other checks", f"<ul>{items}</ul>{note}")
