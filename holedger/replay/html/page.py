"""The whole page: the sections in order, the stylesheet, writing the file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from holedger.ledger.store import Ledger
from holedger.replay.html.data import RunData, collect_run
from holedger.replay.html.diffs import CandidateDiff, candidate_diffs, load_edits
from holedger.replay.html.heldout import held_out_section
from holedger.replay.html.markup import esc, section
from holedger.replay.html.search import candidates_section, tokens_section
from holedger.replay.html.sections import (
    budget_section,
    leakage_section,
    more_section,
    safety_section,
    verdict_section,
)
from holedger.replay.report import ReplayReport
from holedger.untrusted import escape_text

SECTION_IDS = (
    "verdict",
    "budget",
    "candidates",
    "tokens",
    "held-out",
    "safety",
    "leakage",
    "optimizer-log",
)
"""The ``id`` of every section the page always holds, in page order."""


@dataclass(frozen=True)
class Sources:
    """What the page reads beside the ledger, each optional: the run's candidate
    repository (for the diffs), the task's prepared edits folder (to name the edit a
    candidate is), and the optimizer's log file (linked from the page)."""

    repo: Path | None = None
    edits: Path | None = None
    optimizer_log: Path | None = None


CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 color:#1d2433;background:#f6f7f9}
main{max-width:980px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:0 0 12px}h3{font-size:15px}
section{background:#fff;border:1px solid #dfe3ea;border-radius:8px;padding:16px 20px;
 margin:16px 0;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;margin:8px 0;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceff4;vertical-align:top;
 overflow-wrap:break-word}
td:last-child{overflow-wrap:anywhere}
th{background:#f1f3f7}
table.facts td:first-child{width:140px;color:#5b6577}
table.checks td:first-child{width:52px}
table.checks td:nth-child(2){width:200px;overflow-wrap:normal}
table.cases td{font-variant-numeric:tabular-nums}
tr.fail td{background:#fdecec}tr.warn td{background:#fff7e0}
tr.up td:last-child{color:#17692f}tr.down td:last-child{color:#a11a1a}
.verdict{font-size:20px;font-weight:700;padding:6px 12px;border-radius:6px;display:inline-block}
.verdict.ok{background:#e3f6e8;color:#17692f}.verdict.bad{background:#fdecec;color:#a11a1a}
.ok{color:#17692f}.bad{color:#a11a1a}.warnline{color:#8a5a00}.muted{color:#5b6577}.big{font-size:17px}
svg.plot{max-width:100%;height:auto;display:block}
.axis{stroke:#8a93a3;stroke-width:1}.grid{stroke:#eceff4;stroke-width:1}
.tick,.reflabel,.blabel,.bval{font-size:11px;fill:#5b6577}.blabel{fill:#1d2433}
.pt.dev{fill:#2f6fdb}.pt.val{fill:#e07b24}
.trend{stroke-width:1.5;fill:none}.trend.dev{stroke:#2f6fdb}.trend.val{stroke:#e07b24}
.err{stroke:#1d2433;stroke-width:1.2;fill:none}
.bar.dev{fill:#2f6fdb}.bar.val{fill:#e07b24}.bar.test{fill:#7b4fc9}
.bar.seed{fill:#9aa3b2}.bar.nominated{fill:#1f9d55}.bar.budget{fill:#2f6fdb}
.bar.safety{fill:#d64545}.track{fill:#f1f3f7}
.band{fill:#fde9c8}.gmark{fill:#1f9d55;stroke:#fff;stroke-width:2}
pre.diff{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace;background:#f8f9fb;
 border:1px solid #eceff4;padding:8px;white-space:pre-wrap;overflow-wrap:anywhere;margin:6px 0}
.da{color:#17692f;background:#e9f7ee}.dr{color:#a11a1a;background:#fdf0f0}
.dh{color:#5b6577}.df{font-weight:700}
ul{margin:4px 0;padding-left:20px}
code{overflow-wrap:anywhere}
nav a{margin-right:12px;color:#2f6fdb;text-decoration:none}
details{margin:8px 0}summary{cursor:pointer}
"""

NAV = (
    ("verdict", "verdict"),
    ("budget", "budget"),
    ("candidates", "candidates"),
    ("tokens", "tokens"),
    ("held-out", "held-out score"),
    ("safety", "safety"),
    ("leakage", "leakage"),
    ("optimizer-log", "optimizer log"),
)


def optimizer_log_section(log: Path | None, page: Path | None) -> str:
    """A link to the optimizer's log, relative to where the page is written (both files
    stay side by side in the home's reports folder); the page fetches nothing from it."""
    if log is None or not log.is_file():
        body = "<p class='muted'>no optimizer log was kept beside this run's report</p>"
        return section("optimizer-log", "Optimizer log", body)
    href = log.name
    if page is not None:
        href = Path(os.path.relpath(log.resolve(), page.resolve().parent)).as_posix()
    lines = sum(1 for _ in log.open("rb"))
    body = (
        f"<p><a href='{esc(href)}'>{esc(log.name)}</a>: what the optimizer printed as it "
        f"searched ({lines} lines), kept by the server beside this page. It is not signed: "
        "the signed record of what the optimizer did is the run's ledger.</p>"
    )
    return section("optimizer-log", "Optimizer log", body)


def render_html(
    data: RunData,
    report: ReplayReport,
    diffs: dict[str, CandidateDiff] | None = None,
    optimizer_log: Path | None = None,
    page_path: Path | None = None,
    audits: str = "",
) -> str:
    """The whole page as one string (``audits``: the audits section, when the run has
    any)."""
    nav = "".join(
        f'<a href="#{sid}">{esc(name)}</a>'
        for sid, name in (*NAV, *((("audits", "audits"),) if audits else ()))
    )
    state = {"verified-aborted": "verified (aborted)", "failed": "FAILED verification"}.get(
        report.verdict, "verified"
    )
    body = "".join(
        [
            verdict_section(report, data),
            budget_section(report, data),
            candidates_section(data, diffs or {}),
            tokens_section(data),
            held_out_section(report, data),
            safety_section(report, data),
            leakage_section(report),
            optimizer_log_section(optimizer_log, page_path),
            audits,
            more_section(report),
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


def build_report(
    ledger: Ledger,
    run_id: str,
    report: ReplayReport,
    sources: Sources | None = None,
    page_path: Path | None = None,
    audits: str = "",
) -> str:
    """The HTML page of ``run_id`` given its replay report (``audits``: the audits
    section's HTML, made by the audit room, when the run has been audited)."""
    sources = sources or Sources()
    data = collect_run(ledger, run_id)
    pairs = [(c.commit, c.parent) for c in data.candidates]
    diffs = candidate_diffs(sources.repo, pairs, load_edits(sources.edits))
    return render_html(data, report, diffs, sources.optimizer_log, page_path, audits)


def write_report(
    ledger: Ledger,
    run_id: str,
    report: ReplayReport,
    path: Path,
    sources: Sources | None = None,
    audits: str = "",
) -> Path:
    """Render the page and write it to ``path`` (parents created); return the path."""
    page = build_report(ledger, run_id, report, sources, path, audits)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
