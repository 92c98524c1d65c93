"""`holedger demo`: one complete, offline, verified optimization run on the bundled task.

The steps, all in this process except the optimizer and the trials:

1. create the home if needed (operator key, SQLite ledger);
2. start the trusted server's optimizer API and the model gateway in-process, each on a
   unix socket in a private temporary folder (nothing listens on TCP);
3. make sure the task's seed baseline E(H0) is pinned (the first time, a baseline run of
   its own scores the seed harness on the held-out split, K times per case);
4. open a run; run the example optimizer (a standard-library-only program) in its own
   sandbox, which reaches only the API and its gateway scope, through relays;
5. while it works, follow the run's events in the ledger and show progress; when it
   nominates, the server scores the nominee on the held-out split and closes the run;
6. replay the run from its log, write the HTML report, and print the summary.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from rich.console import Console

from holedger.config import Settings
from holedger.demo.interrupt import interrupted, opened_meanwhile
from holedger.demo.optimizer_log import replay_command, save_optimizer_log
from holedger.demo.sandboxed import (
    RunFollower,
    choose_backend,
    demo_progress,
    ensure_home,
    exit_failure,
    follow_optimizer,
    in_daemon_thread,
    optimizer_spec,
    prepare_optimizer_dir,
    private_server,
    ticking,
)
from holedger.ledger.keys import SigningKey
from holedger.numbers import Mean, amount, quantities_for_json, se_text
from holedger.output import console, plain
from holedger.protocol import rules
from holedger.replay.report import ReplayReport, score_text
from holedger.sandboxes.spec import Backend, SandboxResult
from holedger.schemas.events import OptimizerDescriptor

DEMO_TASK = "officeqa-lite"
OPTIMIZER_LABEL = "holedger-example-optimizer"


@dataclass
class DemoSummary:
    """What `holedger demo` reports (``to_json`` is the ``--json`` object)."""

    run_id: str
    verified: bool
    test_score: Fraction | None
    seed_score: Fraction | None
    g: Fraction | None
    resolution_band: Fraction | None
    backend: str
    isolation: str
    report: Path
    budget: dict[str, dict[str, Any]]
    seconds: float
    replay_command: str
    optimizer_log: Path
    optimizer_exit: int | None
    failures: list[str] = field(default_factory=list)
    cases: int | None = None  # test cases held-out scoring scored, each K times
    k: int | None = None
    # The standard errors of the K round means (A3) of E(H+) and of the pinned E(H0).
    test_score_se: str | None = None
    seed_score_se: str | None = None

    @property
    def band_outcome(self) -> str | None:
        """A5: resolved gain (g > b), indistinguishable from 0 (|g| <= b), resolved loss."""
        return rules.band_outcome(self.g, self.resolution_band)

    @property
    def ok(self) -> bool:
        """The demo's success criterion: the run verifies and its gain is resolved."""
        return self.verified and self.band_outcome == rules.RESOLVED_GAIN

    def to_json(self) -> dict[str, Any]:
        """The summary as ``demo --json`` prints it; its Fractions become a number and an
        exact string each (``holedger.numbers``)."""
        return {
            "run_id": self.run_id,
            "verified": self.verified,
            "test_score": self.test_score,
            "test_score_se": self.test_score_se,
            "seed_score": self.seed_score,
            "seed_score_se": self.seed_score_se,
            "g": self.g,
            "resolution_band": self.resolution_band,
            "cases": self.cases,
            "k": self.k,
            "trials": None if self.cases is None or self.k is None else self.cases * self.k,
            "band_outcome": self.band_outcome,
            "resolved_gain": self.band_outcome == rules.RESOLVED_GAIN,
            "backend": self.backend,
            "isolation": self.isolation,
            "report": str(self.report),
            "budget": quantities_for_json(self.budget, ("used", "limit")),
            "seconds": round(self.seconds, 1),
            "replay_command": self.replay_command,
            "optimizer_log": str(self.optimizer_log),
            "optimizer_exit": self.optimizer_exit,
        }


# --------------------------------------------------------------------------- the demo


def run_demo(
    cfg: Settings,
    *,
    backend: str | None = None,
    as_json: bool = False,
    task: str = DEMO_TASK,
    workers: int = 2,
    descriptor: OptimizerDescriptor | None = None,
    shortcuts: bool = False,
    executor: str | None = None,
) -> DemoSummary:
    """Run the whole demo; progress on stderr, the human summary on stdout (not with
    ``as_json``: then the caller prints ``to_json()``). Interrupted (Ctrl-C), it records
    what ran, closes its run as aborted, and raises KeyboardInterrupt (see interrupt.py)."""
    from holedger.demo.report import default_report_path, write_run_page

    started = time.monotonic()
    err = console(stderr=True)
    out = console()

    def say(text: str) -> None:
        err.print(text, soft_wrap=True)  # names and paths stay whole

    chosen = choose_backend(backend, say)
    ensure_home(cfg, say)
    with private_server(cfg, workers=workers, backend=chosen.name, executor=executor) as room:
        reader = room.reader
        run_id: str | None = None
        fut_opt: concurrent.futures.Future[SandboxResult] | None = None
        try:
            service = room.server.service
            server_task = service.task(task)
            terms = server_task.terms
            say(
                f"holedger demo: task [bold]{terms.task_id}[/] "
                f"({terms.split_sizes.get('dev')}/{terms.split_sizes.get('val')}/"
                f"{terms.split_sizes.get('test')} dev/val/test cases, model "
                f"{server_task.model}, an offline simulator); sandbox [bold]{chosen.name}[/]"
            )
            follower = RunFollower(reader)
            test_trials = terms.split_sizes.get("test", 0) * terms.k
            progress = demo_progress(err)
            with progress:
                # 1. the pinned seed baseline (computed once per task), scored in this
                # thread so that an interrupt lands in it (its running trials end, nothing
                # of the scoring is recorded, and the next demo finishes it)
                if not service.baseline_path(server_task).exists():
                    bar = progress.add_task("seed baseline: held-out trials", total=test_trials)

                    def tick_baseline() -> None:
                        done = 0
                        for rid in follower.new_runs():
                            done += follower.poll(rid).get("HeldOutTrial", 0)
                        progress.update(bar, completed=done)

                    with ticking(tick_baseline):
                        baseline = service.ensure_baseline(task, backend=chosen.name)
                    progress.update(bar, completed=test_trials)
                else:
                    baseline = service.ensure_baseline(task, backend=chosen.name)
                say(f"seed baseline E(H0) = {float(baseline.e_h0):.3f} (pinned)")

                # 2. the run, and the optimizer in its own sandbox
                opened = service.open_run(
                    task, optimizer=OPTIMIZER_LABEL, backend=chosen.name, descriptor=descriptor
                )
                run_id = opened.run_id
                follower.known.add(run_id)
                say(f"opened run {run_id}")
                opt_dir = prepare_optimizer_dir(room.folder, server_task.seed_dir.parent / "edits")
                n_edits = sum(1 for p in (opt_dir / "edits").iterdir() if p.is_dir())
                spec = optimizer_spec(
                    opt_dir,
                    run_id,
                    opened.optimizer_token,
                    room.sockets,
                    ["--shortcuts"] if shortcuts else [],
                )
                bars = {
                    "CandidateCommitted": progress.add_task(
                        "candidates committed", total=1 + n_edits
                    ),
                    "EvaluationRequested": progress.add_task(
                        "evaluations (dev and val)", total=None
                    ),
                    "TrialCompleted": progress.add_task("trials (dev and val)", total=None),
                    "HeldOutTrial": progress.add_task(
                        "held-out trials (test, K each)", total=test_trials
                    ),
                }
                fut_opt = in_daemon_thread(chosen.run, spec)
                result = follow_optimizer(fut_opt, follower, run_id, progress, bars)
                for key, bar in bars.items():
                    if progress.tasks[bar].total is None:
                        progress.update(bar, total=follower.counts[run_id].get(key, 0))

            # 3. the optimizer's log, kept beside the report
            log_path = save_optimizer_log(cfg, run_id, result)
            failure = exit_failure(result, "optimizer")
            failures = [] if failure is None else [failure]
            state = service.state(run_id)
            if not state.closed:
                failures.append("the optimizer did not nominate; the run is closed as aborted")
                from holedger.server.lifecycle import abort_run

                abort_run(service, run_id, failures[0])

            # 4. replay and report
            # The demo's own home signed the run: its key is the one to pin.
            home_key = SigningKey.load(cfg.key_path).public
            report, report_path = write_run_page(
                cfg, reader, run_id, default_report_path(cfg, run_id), trusted_keys=[home_key]
            )
        except KeyboardInterrupt:
            if run_id is None:  # cut short while opening its run: the run, if recorded
                run_id = opened_meanwhile(reader, room.runs_before)
            interrupted(cfg, room.server, run_id, fut_opt, say)
            raise

    summary = summarize(
        cfg, report, run_id, chosen, result, report_path, log_path, failures, started
    )
    if not as_json:
        print_summary(out, summary, report)
    return summary


def summarize(
    cfg: Settings,
    report: ReplayReport,
    run_id: str,
    backend: Backend,
    result: SandboxResult,
    report_path: Path,
    log_path: Path,
    failures: list[str],
    started: float,
) -> DemoSummary:
    scores = report.sections.get("scores")
    scores = scores if isinstance(scores, dict) else {}

    def frac(key: str) -> Fraction | None:
        value = scores.get(key)
        return None if value is None else Fraction(str(value))

    budget = {}
    for row in report.sections.get("budget_table") or []:
        if isinstance(row, dict) and "component" in row:
            budget[str(row["component"])] = {
                "used": row.get("used"),
                "limit": row.get("limit"),
                "percent": row.get("percent"),
            }
    return DemoSummary(
        run_id=run_id,
        verified=report.verified,
        test_score=frac("e_h_plus"),
        seed_score=frac("e_h0"),
        test_score_se=scores.get("e_h_plus_se"),
        seed_score_se=scores.get("e_h0_se"),
        g=frac("g"),
        resolution_band=frac("resolution_band"),
        backend=backend.name,
        isolation=result.isolation,
        report=report_path.absolute(),
        budget=budget,
        seconds=time.monotonic() - started,
        replay_command=replay_command(cfg, run_id),
        optimizer_log=log_path.absolute(),
        optimizer_exit=result.exit_status,
        failures=failures,
        cases=scores.get("cases") if isinstance(scores.get("cases"), int) else None,
        k=scores.get("k") if isinstance(scores.get("k"), int) else None,
    )


def print_summary(out: Console, s: DemoSummary, report: ReplayReport) -> None:
    from holedger.output import table

    def line(text: str) -> None:
        # soft wrap: a path or command is never broken across lines (it must copy whole)
        out.print(text, soft_wrap=True)

    def num(v: Fraction | None) -> str:
        return score_text(v)

    def mean(v: Fraction | None) -> str:
        if v is None or not s.cases or not s.k:
            return num(v)
        return Mean.of(v, s.cases, s.k).text()

    for failure in s.failures:
        line(f"[bold red]problem:[/] {plain(failure)}")
    judged = rules.band_outcome_text(s.band_outcome, num(s.resolution_band))
    band = judged if s.band_outcome == rules.RESOLVED_GAIN else f"[bold red]{judged}[/]"
    k = s.k or 0
    plus, zero = se_text(s.test_score_se, k), se_text(s.seed_score_se, k)
    line(f"held-out score E(H+)   {mean(s.test_score)}{plus}  (nominated candidate, test split)")
    line(f"seed baseline  E(H0)   {mean(s.seed_score)}{zero}  (pinned for this task)")
    line(f"normalized gain g      {num(s.g)}  {band}")
    rows = [
        [k, amount(v.get("used")), amount(v.get("limit")), v.get("percent")]
        for k, v in s.budget.items()
    ]
    out.print(table("budget", ["component", "used", "limit", "percent"], rows))
    warnings = [c.name for c in report.checks if c.level == "warning" and not c.ok]
    if s.verified:
        verdict = f"{report.verdict_text} ({report.events} events, {len(report.checks)} checks"
        verdict += f"; warnings: {', '.join(warnings)})" if warnings else ")"
    else:
        failed = ", ".join(report.failed_checks())
        verdict = f"[bold red]FAILED[/] (checks failed: {failed})"
    line(f"replay verdict         {verdict}")
    line(f"sandbox                {s.backend} ({s.isolation})")
    line(f"run id                 {s.run_id}")
    line(f"replay it              {plain(s.replay_command)}")
    line(f"HTML report            {plain(s.report)}")
    line(f"optimizer log          {plain(s.optimizer_log)}")
    line(f"took                   {s.seconds:.0f} s")
