"""Replaying a run as ``holedger replay`` does, and writing its HTML page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from holedger.audit.html import audit_summaries
from holedger.config import Settings
from holedger.errors import HoledgerError
from holedger.ledger.keys import PublicKey
from holedger.ledger.store import Ledger
from holedger.replay.html import Sources, replay_timeline, with_sources, write_report
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


def home_inputs(cfg: Settings, run_id: str) -> CheckInputs:
    """The checks' inputs in a home: its run repositories, so the candidate leakage scan
    can run."""
    return CheckInputs(run_repo=cfg.run_repo(run_id), repos=cfg.run_repo)


def replay_in_home(
    cfg: Settings,
    ledger: Ledger,
    run_id: str,
    progress: Callable[[int, int], None] | None = None,
    trusted_keys: Sequence[PublicKey] = (),
) -> ReplayReport:
    """Replay with the home's run repository, so the candidate leakage scan can run."""
    inputs = home_inputs(cfg, run_id)
    return replay_run(ledger, run_id, trusted_keys=trusted_keys, inputs=inputs, progress=progress)


def default_report_path(cfg: Settings, run_id: str) -> Path:
    return cfg.reports_dir / f"{run_id}.html"


def optimizer_log_path(cfg: Settings, run_id: str) -> Path:
    """Where the demo keeps the optimizer's log of a run, beside its report."""
    return cfg.reports_dir / f"{run_id}.optimizer.jsonl"


def report_sources(cfg: Settings, run_id: str, task_id: str) -> Sources:
    """What the page reads beside the ledger: the run's candidate repository, the task's
    prepared edits (when the task the run names is found here) and the optimizer log."""
    edits = None
    try:
        edits = find_task(task_id) / "edits"
    except HoledgerError:  # a task not installed here: the page names no edits
        edits = None
    return Sources(cfg.run_repo(run_id), edits, optimizer_log_path(cfg, run_id))


def write_run_page(
    cfg: Settings,
    ledger: Ledger,
    run_id: str,
    path: Path,
    progress: Callable[[int, int], None] | None = None,
    trusted_keys: Sequence[PublicKey] = (),
) -> tuple[ReplayReport, Path]:
    """Replay ``run_id`` in the home and write its page to ``path`` from the timeline the
    same replay built; the page is written whether or not the run verifies."""
    report, timeline = replay_timeline(
        ledger,
        run_id,
        inputs=home_inputs(cfg, run_id),
        trusted_keys=trusted_keys,
        progress=progress,
    )
    sources = report_sources(cfg, run_id, timeline.header.task_id)
    timeline = with_sources(timeline, sources).with_audits(audit_summaries(ledger, run_id))
    written = write_report(timeline, path, sources.optimizer_log)
    return report, written


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
        report, path = write_run_page(
            cfg, ledger, run_id, output or default_report_path(cfg, run_id), progress
        )
    finally:
        ledger.close()
    return RenderedReport(run_id, path.absolute(), report.verified, report)
