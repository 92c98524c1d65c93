"""`holedger replay RUN`: verify a run from its log alone."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from holedger.errors import UsageError

if TYPE_CHECKING:
    from holedger.ledger.store import Ledger
from holedger.ledger.keys import PublicKey, load_trusted_keys
from holedger.numbers import amount
from holedger.output import console, emit_json, plain, progress_bar, settings, table
from holedger.protocol.rules import band_outcome_text
from holedger.replay.options import audit_task_option, trusted_key_option
from holedger.replay.report import ReplayReport, counted, score_text, scores_mean_text


def print_report(report: ReplayReport) -> None:
    """The human form of a replay report: verdict, checks, first failures, sections."""
    out = console()
    out.print(f"run {report.run_id}: {report.verdict_text} ({report.events} events)")
    closed = report.sections.get("closed")
    if report.aborted and isinstance(closed, dict):
        why = f": {plain(closed['why'])}" if closed.get("why") else ""
        out.print(f"aborted{why} (closed without a score; analyses leave it out)")
    run = report.sections.get("run")
    if isinstance(run, dict):
        out.print(
            f"task {plain(run.get('task_id'))} (digest {plain(run.get('task_digest'))}), "
            f"optimizer {plain(run.get('optimizer'))}"
        )
        d = run.get("descriptor")
        if isinstance(d, dict):
            out.print(
                plain(
                    f"optimizer descriptor: model {d.get('model')}, family "
                    f"{d.get('family') or 'unknown'}, release {d.get('release') or 'unknown'}, "
                    f"harness {d.get('harness')} ({d.get('harness_scope')}), replicate "
                    f"{d.get('replicate')}"
                ),
                soft_wrap=True,
            )
        else:
            out.print("optimizer descriptor: unknown (the run records only its label)")
    trust = report.sections.get("trust")
    if isinstance(trust, dict) and trust.get("source") != "pinned":
        out.print(
            "keys: the run's own, not pinned: anyone's re-signed log would pass as well "
            "(give the operator's key with --trusted-key)"
        )
    rows = [
        ["ok" if c.ok else ("FAIL" if c.level == "error" else "WARN"), c.name, c.detail]
        for c in report.checks
    ]
    out.print(table("checks", ["", "check", "detail"], rows, fold=("detail",)))
    if report.failures:
        rows = [
            ["-" if f.seq is None else str(f.seq), f.type or "-", f.reason]
            for f in report.failures[:20]
        ]
        out.print(table("first failures", ["seq", "type", "reason"], rows, fold=("reason",)))
        if report.failures_total > 20:
            shown = min(report.failures_total, len(report.failures))
            out.print(
                f"... {report.failures_total - 20} more (--json lists the first {shown}; "
                "the first failure is usually the cause)"
            )
    budget = report.sections.get("budget_table")
    if isinstance(budget, list) and budget:
        if report.judged_on:  # after a break: the table is of the intact part only
            out.print(f"budget: {plain(report.judged_on.strip())}")
        rows = [
            [r.get("component"), amount(r.get("used")), amount(r.get("limit")), r.get("percent")]
            for r in budget
        ]
        out.print(table("budget", ["component", "used", "limit", "percent"], rows))
    print_scores(report)
    safety = report.sections.get("safety")
    if isinstance(safety, dict):
        cats = ", ".join(f"{k}: {v}" for k, v in safety.get("by_category", {}).items())
        out.print(
            f"safety: {plain(report.judged_on)}"
            f"{counted(int(safety.get('violations', 0)), 'violation')}"
            f"{(' (' + plain(cats) + ')') if cats else ''}"
        )


def print_scores(report: ReplayReport) -> None:
    """The recomputed scores and the leakage audit's status, one line each."""
    out = console()
    scores = report.sections.get("scores")
    if isinstance(scores, dict) and scores.get("scored"):
        outcome = scores.get("band_outcome")
        judged = band_outcome_text(
            outcome if isinstance(outcome, str) else None,
            score_text(scores.get("resolution_band")),
        )
        out.print(
            f"scores: {plain(report.judged_on)}E(H+) {scores_mean_text(scores, 'e_h_plus')}; "
            f"E(H0) {scores_mean_text(scores, 'e_h0')}; g {score_text(scores.get('g'))} "
            f"({judged})"
        )
    leakage = report.sections.get("leakage")
    if isinstance(leakage, dict):
        for part in ("audit", "candidate_scan"):
            info = leakage.get(part)
            if isinstance(info, dict):
                found = len(info.get("findings", []))
                state = (
                    info.get("reason") if info.get("status") == "skipped" else f"{found} findings"
                )
                out.print(
                    f"leakage {part.replace('_', ' ')}: {plain(report.judged_on)}"
                    f"{plain(info.get('status'))} ({plain(state)})"
                )


# Other logs than runs that ``holedger replay REF`` verifies when REF names one: a room
# above replay adds a handler when its commands are registered (the audit room adds
# audits). Each is called with (context, ledger, REF, trusted keys, --json); one whose kind
# REF names verifies it and exits, the others return.
OtherLog = Callable[[click.Context, "Ledger", str, list[PublicKey], bool], None]
OTHER_LOGS: list[OtherLog] = []


@click.command("replay")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@trusted_key_option()
@audit_task_option
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Check records in this many processes, this one included (long runs, several cores).",
)
@click.pass_context
def replay_cmd(
    ctx: click.Context,
    run: str,
    as_json: bool,
    trusted: tuple[str, ...],
    task: str | None = None,
    workers: int = 1,
) -> None:
    """Verify RUN from its log: signatures, chain, checkpoints, budgets, disclosures, scores.

    Exit 0 verified, 1 verification failed, 2 bad usage or run not found.
    """
    from holedger.ledger.store import Ledger
    from holedger.replay.inputs import CheckInputs
    from holedger.replay.runs import replay_run

    if Path(run).is_file() and not all(c in "0123456789abcdef-" for c in run.lower()):
        raise UsageError(
            f"{run} is a file: replay reads a run from the home's ledger",
            hint=f"verify a bundle with 'holedger verify {run}'",
        )
    cfg = settings(ctx)
    keys = load_trusted_keys(list(trusted))
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        for other in OTHER_LOGS:
            other(ctx, ledger, run, keys, as_json)
        run_id = ledger.resolve_run(run)
        inputs = CheckInputs(task=task or None, run_repo=cfg.run_repo(run_id), repos=cfg.run_repo)
        with progress_bar("checking events") as progress:
            report = replay_run(
                ledger, run_id, trusted_keys=keys, inputs=inputs, workers=workers, progress=progress
            )
    finally:
        ledger.close()
    if as_json:
        emit_json(report.to_json())
    else:
        print_report(report)
    sys.exit(0 if report.verified else 1)


def register(cli: click.Group) -> None:
    """Add this room's commands to the `holedger` group."""
    cli.add_command(replay_cmd)
