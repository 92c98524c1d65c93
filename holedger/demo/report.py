"""Replaying a run as ``holedger replay`` does, and writing its HTML page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from holedger.audit.html import audits_section
from holedger.config import Settings
from holedger.errors import HoledgerError
from holedger.ledger.keys import PublicKey
from holedger.ledger.store import Ledger
from holedger.replay.html import Sources, write_report
from holedger.replay.inputs import CheckInputs
from holedger.replay.report import ReplayReport
from holedger.replay.runs import replay_run
from holedger.tasks.loader import find_task


@dataclass(frozen=True)
class RenderedReport:
    run_id: str
    path: Path
    verified: bool
    report: ReplayReport


def replay_in_home(
    cfg: Settings,
    ledger: Ledger,
    run_id: str,
    progress: Callable[[int, int], None] | None = None,
    trusted_keys: Sequence[PublicKey] = (),
) -> ReplayReport:
    """Replay with the home's run repository, so the candidate leakage scan can run."""
    inputs = CheckInputs(run_repo=cfg.run_repo(run_id), repos=cfg.run_repo)
    return replay_run(ledger, run_id, trusted_keys=trusted_keys, inputs=inputs, progress=progress)


def default_report_path(cfg: Settings, run_id: str) -> Path:
    return cfg.reports_dir / f"{run_id}.html"


def optimizer_log_path(cfg: Settings, run_id: str) -> Path:
    """Where the demo keeps the optimizer's log of a run, beside its report."""
    return cfg.reports_dir / f"{run_id}.optimizer.jsonl"


def report_sources(cfg: Settings, run_id: str, report: ReplayReport) -> Sources:
    """What the page reads beside the ledger: the run's candidate repository, the task's
    prepared edits (when the task the run names is found here) and the optimizer log."""
    run = report.sections.get("run")
    task_id = run.get("task_id") if isinstance(run, dict) else None
    edits = None
    if isinstance(task_id, str):
        try:
            edits = find_task(task_id) / "edits"
        except HoledgerError:  # a task not installed here: the page names no edits
            edits = None
    return Sources(cfg.run_repo(run_id), edits, optimizer_log_path(cfg, run_id))


def render_run_report(
    cfg: Settings,
    run: str,
    output: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RenderedReport:
    """Replay ``run`` (an id or a unique prefix) and write its page; the page is written
    whether or not the run verifies (it then says what failed)."""
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        run_id = ledger.resolve_run(run)
        report = replay_in_home(cfg, ledger, run_id, progress)
        path = write_report(
            ledger,
            run_id,
            report,
            output or default_report_path(cfg, run_id),
            report_sources(cfg, run_id, report),
            audits_section(ledger, run_id),
        )
    finally:
        ledger.close()
    return RenderedReport(run_id, path.absolute(), report.verified, report)
