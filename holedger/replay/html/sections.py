"""The report's sections on verification: the verdict and checks, the budget, safety, the
leakage audit, and what else replay checked; each a function of the run's timeline. Every
table names its columns: nothing is a dump of a record's keys."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from holedger.numbers import percent, percent_text
from holedger.replay.html.markup import esc, fmt_num, html_table, section
from holedger.replay.html.plots import Bar, bar_rows
from holedger.replay.html.timeline import Timeline
from holedger.replay.html.verdict import ScanFinding, ShownFinding
from holedger.replay.report import counted


def verdict_section(t: Timeline) -> str:
    v = t.verification
    badge = (
        '<p class="verdict ok">VERIFIED (aborted: closed without a score)</p>'
        if v.verified and v.aborted
        else '<p class="verdict ok">VERIFIED</p>'
        if v.verified
        else '<p class="verdict bad">VERIFICATION FAILED</p>'
    )
    states = ["ok" if c.ok else ("FAIL" if c.level == "error" else "WARN") for c in v.checks]
    checks = html_table(
        ["", "check", "detail"],
        [[state, c.name, c.detail] for state, c in zip(states, v.checks, strict=True)],
        cls="checks",
        row_classes=[state.lower() for state in states],
    )
    failures = ""
    if v.failures:
        frows: list[list[Any]] = [
            ["-" if f.seq is None else f.seq, f.type or "-", f.check, f.reason] for f in v.failures
        ]
        columns = ["seq", "type", "check", "reason"]
        failures = "<h3>First failures</h3>" + html_table(columns, frows[:10])
        if len(frows) > 10:
            failures += (
                f"<details><summary>{len(frows) - 10} more listed</summary>"
                f"{html_table(columns, frows[10:])}</details>"
            )
        if v.failures_total > len(v.failures):
            failures += f"<p class='muted'>{v.failures_total - len(v.failures)} more</p>"
    h = t.header
    facts = html_table(
        ["", ""],
        [
            ["run", v.run_id],
            ["task", h.task_id],
            ["optimizer", h.optimizer],
            ["events", v.events],
            ["opened", h.opened_at],
            ["closed", h.closed_at or "not closed"],
            ["gateway calls", f"{t.gateway_calls} ({t.gateway_denied} denied)"],
            ["replay command", f"holedger replay {v.run_id}"],
        ],
        cls="facts",
    )
    trust_html = ""
    if v.trust is not None:
        source, keys = v.trust
        trust_html = f"<p class='muted wrap'>keys: {esc(source)}: " + esc("; ".join(keys)) + "</p>"
    return section(
        "verdict", "Replay verdict and checks", badge + facts + checks + failures + trust_html
    )


def budget_section(t: Timeline) -> str:
    title = "Budget: used and limit per component"
    if not t.verification.budget:
        return section("budget", title, _budget_fallback(t))
    bars, rows = [], []
    for row in t.verification.budget:
        used, limit = row.used, row.limit
        share = percent(used, limit)
        rows.append([row.component, fmt_num(used), fmt_num(limit), percent_text(share)])
        if share is not None:
            text = f"{fmt_num(used)} of {fmt_num(limit)} ({share:.1f}%)"
            bars.append(Bar(row.component, share, text, "budget"))
    body = (bar_rows(bars, scale=100.0) if bars else "") + html_table(
        ["component", "used", "limit", "share"], rows
    )
    return section("budget", title, body)


def _budget_fallback(t: Timeline) -> str:
    """Budget use counted from the events when replay gave no budget table."""
    terms = t.header.terms
    rows: list[list[Any]] = []
    for split in ("dev", "val"):
        acc = [e for e in t.evaluations if e.split == split and e.decision == "accepted"]
        size = (terms.split_sizes.get(split) if terms else None) or 1
        passes = sum((Fraction(e.cases * e.attempts, size) for e in acc), Fraction(0))
        limits = getattr(terms.budget, split) if terms else None
        rows.append([f"{split} calls", len(acc), limits.calls if limits else "?"])
        rows.append(
            [
                f"{split} case_passes",
                fmt_num(passes),
                fmt_num(limits.case_passes if limits else None),
            ]
        )
    note = "<p class='muted'>counted from the events (replay reported no budget table)</p>"
    return note + html_table(["component", "used", "limit"], rows)


def safety_section(t: Timeline) -> str:
    safety = t.verification.safety
    parts = []
    if safety is not None:
        parts.append(
            f"<p>{esc(counted(safety.violations, 'safety violation'))} over "
            f"{esc(counted(safety.trials, 'trial'))}; "
            f"{esc(counted(safety.unisolated, 'trial'))} ran without isolation"
            + (
                f"; {esc(counted(safety.not_run, 'trial'))} recorded as not run"
                if safety.not_run
                else ""
            )
            + ".</p>"
        )
        if safety.by_category:
            top = max(n for _, n in safety.by_category)
            parts.append(
                bar_rows(
                    [Bar(k, float(n), str(n), "safety") for k, n in safety.by_category],
                    scale=float(top),
                )
            )
    parts.append(
        _limited(
            ["seq", "category", "trial", "call", "detail"],
            [[x.seq, x.category, x.trial_id, x.call_id, x.detail] for x in t.violations],
        )
    )
    backends = sorted({f"{x.backend} ({x.isolation})" for x in t.trials})
    if backends:
        parts.append(f"<p class='muted'>sandbox backends: {esc(', '.join(backends))}</p>")
    return section("safety", "Safety", "".join(parts))


def _limited(columns: list[str], rows: list[list[Any]], limit: int = 200) -> str:
    """A table of at most ``limit`` rows, the rest counted; "none" when there are none."""
    if not rows:
        return "<p class='muted'>none</p>"
    more = f"<p class='muted'>… {len(rows) - limit} more</p>" if len(rows) > limit else ""
    return html_table(columns, rows[:limit]) + more


def _findings_table(findings: tuple[ShownFinding | ScanFinding, ...]) -> str:
    """The audit's findings (a projection shown to the optimizer that holds held-out
    items) or the candidate scan's (a committed file that does)."""
    shown = [f for f in findings if isinstance(f, ShownFinding)]
    scan = [f for f in findings if isinstance(f, ScanFinding)]
    out = ""
    if shown:
        rows: list[list[Any]] = [[f.seq, f.request_id, ", ".join(f.items)] for f in shown]
        out += html_table(["seq", "request", "held-out items it holds"], rows)
    if scan:
        rows = [[f.index, f.file, f.kind, f.items, f.where] for f in scan]
        out += html_table(["candidate", "file", "kind", "items", "where"], rows)
    return out


def leakage_section(t: Timeline) -> str:
    leakage = t.verification.leakage

    def cls(ok: bool, detail: str) -> str:
        return "bad" if not ok else ("warnline" if "skipped" in detail else "ok")

    head = "".join(
        f"<p class='{cls(c.ok, c.detail)}'><b>{esc(c.name)}</b>: {esc(c.detail)}</p>"
        for c in t.verification.named("leakage", "candidate_scan")
    )
    if leakage is None:
        body = head + "<p class='muted'>replay reported no leakage audit for this run</p>"
        return section("leakage", "Leakage audit", body)
    parts = [head]
    for info, title in (
        (leakage.audit, "What the optimizer was shown"),
        (leakage.candidate_scan, "Committed candidates"),
    ):
        if info is not None:
            reason = f": {info.reason}" if info.reason else ""
            parts.append(
                f"<h3>{esc(title)}</h3><p>{esc(info.status)}{esc(reason)}; "
                f"{esc(counted(len(info.findings), 'finding'))}</p>"
            )
            if info.findings:
                parts.append(_findings_table(info.findings))
    if leakage.lists_shown:
        rows: list[list[Any]] = [
            [d.seq, d.request_id, d.split, d.policy, d.digest] for d in t.disclosures
        ]
        table = _limited(["seq", "request", "split", "policy", "projection digest"], rows)
        parts.append(
            f"<details><summary>{counted(len(rows), 'projection')} shown to the optimizer, by "
            f"digest</summary>{table}</details>"
        )
    if leakage.rules:
        text = ", ".join(f"{k} {v}" for k, v in leakage.rules)
        parts.append(f"<p class='muted'>matching rules: {esc(text)}</p>")
    return section("leakage", "Leakage audit", "".join(parts))


def more_section(t: Timeline) -> str:
    """The other checks' sections in one line each: what they found, in words."""
    v = t.verification
    lines = []
    if v.baseline is not None:
        b = v.baseline
        if not b.checked:
            lines.append(f"seed baseline: not checked ({b.reason or 'no reason'})")
        else:
            state = "verified" if b.verified else "did not verify"
            matches = "matches the pin" if b.matches else "does not match the pin"
            lines.append(f"seed baseline run {b.run_id}: {state}, {matches}")
    if v.rescored is not None:
        status, why = v.rescored
        lines.append(f"re-scoring of answers: {status}" + (f" ({why})" if why else ""))
    if v.gateway is not None:
        g = v.gateway
        lines.append(
            f"gateway: {counted(g.calls, 'call')}, {g.target_tokens} target tokens "
            f"(cap {g.target_cap}), {g.optimizer_tokens} optimizer tokens, "
            f"overshoot {g.overshoot}"
        )
    if v.closed is not None:
        reason, why = v.closed
        lines.append(f"run closed: {reason}" + (f": {why}" if why else ""))
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    note = (
        "<p class='muted'>every section in full: <code>holedger replay "
        f"{esc(v.run_id)} --json</code></p>"
    )
    return section("more", "Other checks", f"<ul>{items}</ul>{note}")
