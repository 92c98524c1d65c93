"""The audits of a run for its HTML report: each audit of the run as recorded, read into the
report's typed :class:`~holedger.replay.html.audits.AuditSummary` (the numbers are
re-derived by ``holedger audit verify AUDIT``, not on the page)."""

from __future__ import annotations

from typing import Any

from holedger.replay.html.audits import AuditSummary, audits_html


def audit_summaries(ledger: Any, run_id: str) -> tuple[AuditSummary, ...]:
    """Each audit of ``run_id`` in the ledger, as its auditor recorded it."""
    from holedger.audit.hda import read_audit
    from holedger.audit.log import AuditLog

    log = AuditLog(ledger.app.engine, create=False)
    states = [read_audit(log, a) for a in log.audit_ids()]
    return tuple(_summary(s) for s in states if s.opened.run_id == run_id)


def audits_section(ledger: Any, run_id: str) -> str:
    """The section, or "" when no audit of ``run_id`` is in the ledger."""
    return audits_html(audit_summaries(ledger, run_id))


def _summary(state: Any) -> AuditSummary:
    checks = tuple((check, result) for _, check, result in check_rows(state))
    return AuditSummary(*_row(state), checks=checks)


def _row(state: Any) -> tuple[str, str, str, str, str, str, str, str, str]:
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
    # the page escapes every cell
    return (
        str(state.audit_id),
        str(status),
        gate_text,
        k,
        found,
        str(d["O"]) if d else "-",
        str(d["T"]) if d else "-",
        str(d["G"]) if d else "-",
        shares,
    )


def check_rows(state: Any) -> list[list[str]]:
    """B5 (transfer, validation selection) and B6 (held-out strata, types left out of the
    search) as recorded, one row each; "not computed" where the audit has none."""
    d = state.decomposed
    transfer = d.transfer if d else None
    rows = [["B5 transfer", _transfer_text(transfer)]]
    rows.append(["B5 validation selection", _val_text(transfer)])
    strata = state.gate.held_out_strata if state.gate else []
    left = state.gate.left_out_types if state.gate else []
    if not strata:
        rows.append(["B6 held-out strata", "not computed (no tagged held-out scores)"])
    for r in strata:
        rows.append(
            [
                f"B6 held-out stratum {r['tag']}",
                f"{r['cases']} test cases, S_test(H^) {r['s_candidate']}, "
                f"S_test(H0) {r['s_base']}, difference {r['delta']}",
            ]
        )
    if strata and not left:
        rows.append(["B6 leave-type-out", "no tags left out of the search"])
    for r in left:
        verdict = "near-perfect (overfitting)" if r["near_perfect"] else "not near-perfect"
        rows.append(
            [
                f"B6 left out {r['tag']}",
                f"no search case has it; S_test(H^) {r['s_candidate']} on {r['cases']} "
                f"test cases, S_test(H0) {r['s_base']}: {verdict}",
            ]
        )
    return [[state.audit_id, *row] for row in rows]


def _transfer_text(t: dict[str, Any] | None) -> str:
    if not t:
        return "not computed"
    return (
        f"held-out gain {t['held_out_delta']} against search gain {t['search_delta']} "
        f"(below: {_yes(t['below_search'])}, below half: {_yes(t['below_half_search'])}, "
        f"below 0: {_yes(t['below_zero'])})"
    )


def _val_text(t: dict[str, Any] | None) -> str:
    v = t.get("val_selection") if t else None
    if not v:
        return "not computed"
    return (
        f"val-selected {v['val_selected']} (search-selected H^ {v['search_selected']}): "
        f"held-out gain {v['held_out_val_selected']} against {v['held_out_search_selected']} "
        f"(improves: {_yes(v['improves'])}, worsens: {_yes(v['worsens'])}, below the search "
        f"gain: {_yes(v['val_below_search_gain'])})"
    )


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
