"""The audits section of a run's page: each Harness-Delta Attribution audit of the run as
its auditor recorded it (the numbers are re-derived by ``holedger audit verify AUDIT``, not
on this page). The audit room reads its log into :class:`AuditSummary` values; this module
renders them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from holedger.replay.html.markup import html_table

SECTION_ID = "audits"


@dataclass(frozen=True)
class AuditSummary:
    """One audit as recorded, each figure as the audit spells it ("-" where it has none):
    its gate, scale k, findings, the decomposition O, T, G and their shares, and its B5 and
    B6 checks, ``(check, result)`` each."""

    audit_id: str
    status: str
    gate: str
    k: str
    findings: str
    o: str
    t: str
    g: str
    shares: str
    checks: tuple[tuple[str, str], ...] = ()


def audits_html(audits: Sequence[AuditSummary]) -> str:
    """The section, or "" when the run has no audit."""
    if not audits:
        return ""
    rows = [
        [a.audit_id, a.status, a.gate, a.k, a.findings, a.o, a.t, a.g, a.shares] for a in audits
    ]
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
    checks = html_table(
        ["audit", "check", "result"], [[a.audit_id, *row] for a in audits for row in a.checks]
    )
    return (
        f'<section id="{SECTION_ID}"><h2>Harness-Delta Attribution audits</h2>'
        "<p class='muted'>As each audit recorded it, signed by its auditor; "
        "<code>holedger audit verify AUDIT</code> recomputes every number from the logs. "
        "O counts only detected, removed overfitting; G is not evidence of transfer.</p>"
        f"{table}<h3>B5 transfer and B6 held-out strata</h3>{checks}</section>"
    )
