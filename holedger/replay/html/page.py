"""The whole page: the sections in order, the stylesheet, writing the file."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from holedger.ledger.keys import PublicKey
from holedger.ledger.store import Ledger
from holedger.replay.checks import CHECKS
from holedger.replay.html.audits import SECTION_ID as AUDITS_ID
from holedger.replay.html.audits import audits_html
from holedger.replay.html.diffs import candidate_diffs, load_edits
from holedger.replay.html.evolve import SECTION_ID as EVOLVE_ID
from holedger.replay.html.evolve import evolve_section
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
from holedger.replay.html.timeline import Timeline, build_timeline, collecting
from holedger.replay.html.verdict import verification
from holedger.replay.inputs import BaselineRun, BaselineSource, CheckInputs
from holedger.replay.report import ReplayReport
from holedger.replay.runs import LedgerBaselines, replay_run
from holedger.schemas.events import RunScored
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
    timeline: Timeline,
    optimizer_log: Path | None = None,
    page_path: Path | None = None,
) -> str:
    """The whole page as one string, from the run's timeline alone (and the optimizer's
    log it links, relative to ``page_path``)."""
    t = timeline
    audits = audits_html(t.audits)
    evolve = evolve_section(t)
    links = list(NAV)
    if evolve:  # after the tokens, as on the page
        links.insert(links.index(("tokens", "tokens")) + 1, (EVOLVE_ID, "solve-evolve"))
    if audits:
        links.append((AUDITS_ID, "audits"))
    nav = "".join(f'<a href="#{sid}">{esc(name)}</a>' for sid, name in links)
    state = {"verified-aborted": "verified (aborted)", "failed": "FAILED verification"}.get(
        t.verification.verdict, "verified"
    )
    body = "".join(
        [
            verdict_section(t),
            budget_section(t),
            candidates_section(t),
            tokens_section(t),
            evolve,
            held_out_section(t),
            safety_section(t),
            leakage_section(t),
            optimizer_log_section(optimizer_log, page_path),
            audits,
            more_section(t),
        ]
    )
    judged = t.verification.judged_on
    cut = (
        f"<p class='bad'>The log breaks: what the tables and plots show is "
        f"{esc(judged.strip().strip('[]'))}.</p>"
        if judged
        else ""
    )
    run_id = t.run_id
    page = (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>holedger run {esc(run_id)}</title>"
        f"<style>{CSS}</style></head><body><main>"
        f"<header><h1>holedger run report</h1><p class='muted'>run {esc(run_id)} on "
        f"task {esc(t.header.task_id)}: {esc(state)}. This page is self-contained: it loads "
        "nothing from anywhere.</p><nav>"
        f"{nav}</nav></header>{cut}{body}"
        "<footer><p class='muted'>Re-derive everything on this page from the signed log with "
        f"<code>holedger replay {esc(run_id)}</code>.</p></footer>"
        "</main></body></html>\n"
    )
    # Whatever a section put in without esc(): no raw control byte leaves the page.
    return escape_text(page, keep="\n")


def replay_timeline(
    ledger: Ledger,
    run_id: str,
    *,
    inputs: CheckInputs | None = None,
    trusted_keys: Sequence[PublicKey] = (),
    progress: Callable[[int, int], None] | None = None,
) -> tuple[ReplayReport, Timeline]:
    """Replay ``run_id`` with the registered checks (as ``holedger replay`` does) and build
    its timeline from the same pass."""
    inputs = CheckInputs() if inputs is None else inputs
    baselines: BaselineSource | None = inputs.baselines
    if baselines is None and not inputs.baseline_replay:
        baselines = LedgerBaselines(ledger, trusted_keys, inputs)
        inputs = replace(inputs, baselines=baselines)
    checks, collected = collecting(CHECKS)
    report = replay_run(
        ledger, run_id, trusted_keys=trusted_keys, inputs=inputs, checks=checks, progress=progress
    )

    def baseline(base_id: str) -> RunScored | None:
        found = baselines.baseline(base_id) if baselines is not None else None
        return found.scored if isinstance(found, BaselineRun) else None

    return report, build_timeline(run_id, collected, verification(report), baseline)


def with_sources(timeline: Timeline, sources: Sources) -> Timeline:
    """The timeline with each candidate's diff read from the run's repository, and the
    prepared edit it is, where there is one."""
    pairs = [(c.commit, c.parent) for c in timeline.candidates]
    return timeline.with_diffs(candidate_diffs(sources.repo, pairs, load_edits(sources.edits)))


def write_report(timeline: Timeline, path: Path, optimizer_log: Path | None = None) -> Path:
    """Render the page and write it to ``path`` (parents created), linking the optimizer's
    log when there is one; return the path."""
    page = render_html(timeline, optimizer_log, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
