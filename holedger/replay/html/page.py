"""The whole page: the sections in order, the stylesheet, writing the file."""

from __future__ import annotations

from pathlib import Path

from holedger.ledger.store import Ledger
from holedger.replay.html.data import RunData, collect_run
from holedger.replay.html.markup import esc
from holedger.replay.html.sections import (
    budget_section,
    candidates_section,
    held_out_section,
    leakage_section,
    other_sections,
    safety_section,
    tokens_section,
    verdict_section,
)
from holedger.replay.report import ReplayReport
from holedger.schemas.untrusted import escape_text

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


def render_html(data: RunData, report: ReplayReport, audits: str = "") -> str:
    """The whole page as one string (``audits``: the audits section, when the run has
    any)."""
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
            *((("audits", "audits"),) if audits else ()),
        )
    )
    state = {"verified-aborted": "verified (aborted)", "failed": "FAILED verification"}.get(
        report.verdict, "verified"
    )
    body = "".join(
        [
            verdict_section(report, data),
            budget_section(report, data),
            candidates_section(data),
            tokens_section(data),
            held_out_section(report, data),
            safety_section(report, data),
            leakage_section(report),
            audits,
            other_sections(report),
        ]
    )
    unreadable = (
        f"<p class='bad'>{data.unreadable} stored records could not be read for the plots</p>"
        if data.unreadable
        else ""
    )
    page = (
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
    # Whatever a section put in without esc(): no raw control byte leaves the page.
    return escape_text(page, keep="\n")


def build_report(ledger: Ledger, run_id: str, report: ReplayReport) -> str:
    """The HTML page of ``run_id`` given its replay report."""
    from holedger.audit.html import audits_section

    return render_html(collect_run(ledger, run_id), report, audits_section(ledger, run_id))


def write_report(ledger: Ledger, run_id: str, report: ReplayReport, path: Path) -> Path:
    """Render the page and write it to ``path`` (parents created); return the path."""
    page = build_report(ledger, run_id, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
