"""The audits section of a run's HTML report: each audit of the run as recorded (the
numbers are re-derived by ``holedger audit verify AUDIT``, not on this page)."""

from __future__ import annotations

from typing import Any

from holedger.replay.html.markup import html_table


def audits_section(ledger: Any, run_id: str) -> str:
    """The section, or "" when no audit of ``run_id`` is in the ledger."""
    from holedger.audit.hda import read_audit
    from holedger.audit.log import AuditLog

    log = AuditLog(ledger.app.engine, create=False)
    states = [read_audit(log, a) for a in log.audit_ids()]
    states = [s for s in states if s.opened.run_id == run_id]
    if not states:
        return ""
    rows = [_row(s) for s in states]
    table = html_table(
        [
            "audit",
            "status",
            "gate: dS [95% interval], p",
            "k",
            "findings",
            "O (lower bound)",
            "T",
            "G (upper bound)",
            "shares o / t / g",
        ],
        rows,
    )
    return (
        '<section id="audits"><h2>Harness-Delta Attribution audits</h2>'
        "<p class='muted'>As each audit recorded it, signed by its auditor; "
        "<code>holedger audit verify AUDIT</code> recomputes every number from the logs. "
        "O counts only detected, removed overfitting; G is not evidence of transfer.</p>"
        f"{table}</section>"
    )


def _row(state: Any) -> list[str]:
    gate = state.gate.gate if state.gate else None
    d = state.decomposed.decomposition if state.decomposed else None
    status = state.decomposed.status if state.decomposed else "opened"
    gate_text = "-"
    if gate:
        low, high = gate["interval"]
        gate_text = f"{gate['delta']} [{low}, {high}], p = {gate['p_value']}"
    k = str(state.scale.scale["k"]) + f" ({state.scale.scale['basis']})" if state.scale else "-"
    found = ", ".join(sorted({f.category for f in state.findings})) or "none"
    shares = "-"
    if d and d.get("shares"):
        s = d["shares"]
        shares = f"{s['o']} / {s['t']} / {s['g']}"
    # html_table escapes every cell
    return [
        state.audit_id,
        status,
        gate_text,
        k,
        found,
        d["O"] if d else "-",
        d["T"] if d else "-",
        d["G"] if d else "-",
        shares,
    ]
