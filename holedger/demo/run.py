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
import contextlib
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from holedger.config import Settings
from holedger.demo.interrupt import in_daemon_thread, interrupted, opened_meanwhile
from holedger.demo.optimizer_log import replay_command, save_optimizer_log
from holedger.errors import SandboxError
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.numbers import Mean, amount, quantities_for_json, se_text
from holedger.output import console, plain
from holedger.protocol import rules
from holedger.replay.report import ReplayReport, score_text
from holedger.sandboxes import get_backend
from holedger.sandboxes.spec import Backend, Limits, SandboxResult, SandboxSpec
from holedger.schemas.events import OptimizerDescriptor

if TYPE_CHECKING:
    from holedger.server.serve import RunningServer

DEMO_TASK = "officeqa-lite"
OPTIMIZER_LABEL = "holedger-example-optimizer"
OPTIMIZER_SOURCE = Path(__file__).resolve().parent / "optimizer" / "optimizer.py"
OPTIMIZER_LIMITS = Limits(wall_s=1800.0, memory_mb=512, pids=64, output_bytes=8 << 20)
POLL_S = 0.25
T = TypeVar("T")


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


# --------------------------------------------------------------------------- pieces


def choose_backend(name: str | None, say: Callable[[str], None]) -> Backend:
    """The named backend, or the strongest isolating one; ``process`` only as a loud last
    resort (trials and the optimizer then run unisolated, and replay says so)."""
    if name is not None:
        backend = get_backend(name)
    else:
        try:
            backend = get_backend(None)
        except SandboxError as exc:
            say(f"[bold red]WARNING[/]: {plain(exc.message)}")
            backend = get_backend("process")
    if backend.name == "process":
        say(
            "[bold red]WARNING: sandbox backend 'process' gives NO isolation: the optimizer "
            "and every trial run as ordinary processes on this machine. Replay flags each "
            "unisolated trial.[/]"
        )
    return backend


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free right now: the optimizer's relays listen on them (inside
    its sandbox, or on the host with the ``process`` backend, where fixed ports could
    collide with a running ``holedger serve``)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def prepare_optimizer_dir(root: Path, edits_dir: Path) -> Path:
    """The optimizer's read-only tree: the program and the prepared edits (its own plan).
    It reads the seed harness through the API, as any optimizer does."""
    opt = root / "optimizer"
    opt.mkdir()
    shutil.copyfile(OPTIMIZER_SOURCE, opt / "optimizer.py")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    if edits_dir.is_dir():
        shutil.copytree(edits_dir, opt / "edits", ignore=ignore)
    else:
        (opt / "edits").mkdir()
    for path in [opt, *opt.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return opt


def start_private_server(
    cfg: Settings, ledger: Ledger, private: Path, **options: Any
) -> RunningServer:
    """The API and the gateway in this process, each on a unix socket in ``private`` (a
    folder of this process's own: nothing listens on TCP); ``options`` go to start_server."""
    from holedger.server.serve import start_server

    private.chmod(0o711)
    return start_server(
        cfg,
        ledger,
        host=None,
        port=None,
        socket=private / "api.sock",
        gateway_port=None,
        gateway_socket=private / "gateway.sock",
        **options,
    )


def optimizer_spec(
    opt_dir: Path, run_id: str, token: str, sockets: tuple[Path, Path], args: Sequence[str]
) -> SandboxSpec:
    """The example optimizer's sandbox for ``run_id``: its tree, its arguments, and relays
    from two loopback ports to the API's and the gateway's unix sockets (``sockets``)."""
    api_port, gw_port = free_ports(2)
    return SandboxSpec(
        code_dir=opt_dir,
        argv=["python3", "optimizer.py", "--edits", "edits", *args],
        env={
            "HOLEDGER_API_URL": f"http://127.0.0.1:{api_port}/v1/runs/{run_id}",
            "HOLEDGER_API_TOKEN": token,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{gw_port}/v1",
            "OPENAI_API_KEY": token,
        },
        relays={api_port: sockets[0], gw_port: sockets[1]},
        limits=OPTIMIZER_LIMITS,
        label=f"optimizer-{run_id[:8]}",
    )


class RunFollower:
    """Follows runs in the ledger from the main thread and counts what happened."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.after: dict[str, int] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.nominated: dict[str, bool] = {}
        self.known = set(ledger.run_ids())

    def new_runs(self) -> list[str]:
        ids = [r for r in self.ledger.run_ids() if r not in self.known]
        return ids

    def poll(self, run_id: str) -> dict[str, int]:
        counts = self.counts.setdefault(run_id, {})
        after = self.after.get(run_id, -1)
        for rec in self.ledger.records(run_id, after_seq=after):
            after = rec.seq
            key = rec.type
            if rec.type == "TrialCompleted" and rec.payload.get("split") == "test":
                key = "HeldOutTrial"
            elif rec.type == "EvaluationRequested" and rec.payload.get("split") == "test":
                key = "HeldOutRequest"
            counts[key] = counts.get(key, 0) + 1
        self.after[run_id] = after
        return counts


def _wait(
    future: concurrent.futures.Future[T], tick: Callable[[], None], poll_s: float = POLL_S
) -> T:
    while True:
        try:
            return future.result(timeout=poll_s)
        except concurrent.futures.TimeoutError:
            tick()


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
    if not cfg.key_path.exists():
        Ledger.init_home(cfg)
        say(f"created the home {plain(cfg.home)}")
    ledger = Ledger.from_settings(cfg)
    reader = Ledger.open(cfg.ledger_url, None, create_tables=False)
    runs_before = set(reader.run_ids())
    private = Path(tempfile.mkdtemp(prefix="holedger-demo-"))
    api_sock, gw_sock = private / "api.sock", private / "gateway.sock"
    server = start_private_server(
        cfg, ledger, private, workers=workers, backend=chosen.name, executor=executor
    )
    run_id: str | None = None
    fut_opt: concurrent.futures.Future[SandboxResult] | None = None
    try:
        service = server.service
        server_task = service.task(task)
        terms = server_task.terms
        say(
            f"holedger demo: task [bold]{terms.task_id}[/] "
            f"({terms.split_sizes.get('dev')}/{terms.split_sizes.get('val')}/"
            f"{terms.split_sizes.get('test')} dev/val/test cases, model {server_task.model}, "
            "an offline simulator); "
            f"sandbox [bold]{chosen.name}[/]"
        )
        follower = RunFollower(reader)
        test_trials = terms.split_sizes.get("test", 0) * terms.k
        progress = Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        with progress:
            # 1. the pinned seed baseline (computed once per task), scored in this thread
            # so that an interrupt lands in it (its running trials end, nothing of the
            # scoring is recorded, and the next demo finishes it)
            if not service.baseline_path(server_task).exists():
                bar = progress.add_task("seed baseline: held-out trials", total=test_trials)

                def tick_baseline() -> None:
                    done = 0
                    for rid in follower.new_runs():
                        done += follower.poll(rid).get("HeldOutTrial", 0)
                    progress.update(bar, completed=done)

                with _ticking(tick_baseline):
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
            seed_dir = server_task.seed_dir
            opt_dir = prepare_optimizer_dir(private, seed_dir.parent / "edits")
            n_edits = sum(1 for p in (opt_dir / "edits").iterdir() if p.is_dir())
            spec = optimizer_spec(
                opt_dir,
                run_id,
                opened.optimizer_token,
                (api_sock, gw_sock),
                ["--shortcuts"] if shortcuts else [],
            )
            bars = {
                "CandidateCommitted": progress.add_task("candidates committed", total=1 + n_edits),
                "EvaluationRequested": progress.add_task("evaluations (dev and val)", total=None),
                "TrialCompleted": progress.add_task("trials (dev and val)", total=None),
                "HeldOutTrial": progress.add_task(
                    "held-out trials (test, K each)", total=test_trials
                ),
            }
            fut_opt = in_daemon_thread(chosen.run, spec)

            def tick_run() -> None:
                assert run_id is not None
                counts = follower.poll(run_id)
                for key, bar in bars.items():
                    progress.update(bar, completed=counts.get(key, 0))

            result: SandboxResult = _wait(fut_opt, tick_run)
            tick_run()
            for key, bar in bars.items():
                if progress.tasks[bar].total is None:
                    progress.update(bar, total=follower.counts[run_id].get(key, 0))

        # 3. the optimizer's log, kept beside the report
        log_path = save_optimizer_log(cfg, run_id, result)
        failures: list[str] = []
        if result.exit_status != 0 or result.timed_out:
            why = "timed out" if result.timed_out else f"exited with status {result.exit_status}"
            tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            failures.append(f"the optimizer {why}: {' | '.join(tail)}")
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
        if run_id is None:  # cut short while opening its run: the run, if it was recorded
            run_id = opened_meanwhile(reader, runs_before)
        interrupted(cfg, server, run_id, fut_opt, say)
        raise
    finally:
        server.stop()
        reader.close()
        ledger.close()
        shutil.rmtree(private, ignore_errors=True)

    summary = summarize(
        cfg, report, run_id, chosen, result, report_path, log_path, failures, started
    )
    if not as_json:
        print_summary(out, summary, report)
    return summary


@contextmanager
def _ticking(tick: Callable[[], None], poll_s: float = POLL_S) -> Iterator[None]:
    """Call ``tick`` every ``poll_s`` seconds in a daemon thread while the body runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(poll_s):
            with contextlib.suppress(Exception):  # a progress bar never breaks the demo
                tick()

    threading.Thread(target=loop, name="demo-progress", daemon=True).start()
    try:
        yield
    finally:
        stop.set()


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
