"""`holedger demo --protocol solve-evolve`: the demo task as a solve-evolve run, offline.

As `holedger demo` does for a search run: the home, the server's API and gateway on unix
sockets in a private folder, then a solve-evolve run of the task's dev stream (its NONE
run first, once per stream), the example optimizer's evolver mode in its own sandbox
(one prepared edit or none after each scored batch), and the replay of the closed run.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from holedger.config import Settings
from holedger.demo import sandboxed as box
from holedger.demo.interrupt import interrupted
from holedger.demo.optimizer_log import replay_command, save_optimizer_log
from holedger.demo.run import DEMO_TASK
from holedger.ledger.keys import SigningKey
from holedger.output import console, plain
from holedger.sandboxes.spec import SandboxResult
from holedger.schemas.events import OptimizerDescriptor

EVOLVER_LABEL = "holedger-example-evolver"
DEFAULT_BATCH = 4


@dataclass
class EvolveSummary:
    run_id: str
    verified: bool
    j: Fraction | None
    base: Fraction | None
    delta: Fraction | None
    steps: int
    batch: int
    commits: int
    backend: str
    seconds: float
    replay_command: str
    optimizer_log: Path
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verified and self.j is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": "solve-evolve",
            "run_id": self.run_id,
            "verified": self.verified,
            "j": self.j,
            "base": self.base,
            "delta": self.delta,
            "steps": self.steps,
            "batch": self.batch,
            "commits": self.commits,
            "backend": self.backend,
            "seconds": round(self.seconds, 1),
            "replay_command": self.replay_command,
            "optimizer_log": str(self.optimizer_log),
            "failures": self.failures,
        }


def run_evolve_demo(
    cfg: Settings,
    *,
    batch: int = DEFAULT_BATCH,
    steps: int | None = None,
    backend: str | None = None,
    as_json: bool = False,
    task: str = DEMO_TASK,
    workers: int = 2,
    descriptor: OptimizerDescriptor | None = None,
) -> EvolveSummary:
    """Run the solve-evolve demo; progress on stderr, the summary on stdout (not with
    ``as_json``: the caller prints ``to_json()``)."""
    from holedger.demo.report import replay_in_home
    from holedger.server.evolve import EvolveRuns

    started = time.monotonic()
    err = console(stderr=True)

    def say(text: str) -> None:
        err.print(text, soft_wrap=True)

    chosen = box.choose_backend(backend, say)
    box.ensure_home(cfg, say)
    with box.private_server(cfg, workers=workers, backend=chosen.name) as room:
        run_id: str | None = None
        fut: concurrent.futures.Future[SandboxResult] | None = None
        try:
            service = room.server.service
            runs = EvolveRuns(service)
            dev = len(service.task(task).cases("dev"))
            count = steps if steps is not None else max(1, dev // max(batch, 1))
            terms = runs.terms_for(
                task, batch=batch, steps=count, scope=None, step_tokens=None, stream=None
            )
            say(
                f"holedger demo (solve-evolve): task [bold]{task}[/], {terms.steps} steps of "
                f"{terms.batch} dev cases, scope {', '.join(terms.scope)}; sandbox "
                f"[bold]{chosen.name}[/]; the stream's NONE run first, when it has none yet"
            )
            opened = runs.open_run(
                task, terms, optimizer=EVOLVER_LABEL, backend=chosen.name, descriptor=descriptor
            )
            run_id = opened.run_id
            say(f"opened run {run_id}")
            seed_dir = service.task(task).seed_dir
            opt_dir = box.prepare_optimizer_dir(room.folder, seed_dir.parent / "edits")
            spec = box.optimizer_spec(
                opt_dir,
                run_id,
                opened.optimizer_token,
                room.sockets,
                ["--protocol", "solve-evolve"],
                label="evolver",
            )
            follower = box.RunFollower(room.reader)
            progress = box.demo_progress(err)
            with progress:
                bars = {
                    "StepClosed": progress.add_task("steps closed", total=terms.steps),
                    "TrialCompleted": progress.add_task(
                        "trials (in situ)", total=terms.steps * terms.batch
                    ),
                }
                fut = box.in_daemon_thread(chosen.run, spec)
                result = box.follow_optimizer(fut, follower, run_id, progress, bars)
            log_path = save_optimizer_log(cfg, run_id, result)
            failure = box.exit_failure(result, "evolver")
            failures = [] if failure is None else [failure]
            if not service.state(run_id).closed:
                failures.append("the evolver stopped before the last step; closed as aborted")
                service.abort(run_id, failures[-1])
            home_key = SigningKey.load(cfg.key_path).public
            report = replay_in_home(cfg, room.reader, run_id, trusted_keys=[home_key])
        except KeyboardInterrupt:
            interrupted(cfg, room.server, run_id, fut, say)
            raise
    section = report.sections.get("solve_evolve") or {}

    def frac(key: str) -> Fraction | None:
        value = section.get(key)
        return None if value is None else Fraction(str(value))

    closed = section.get("closed_steps") or []
    summary = EvolveSummary(
        run_id=run_id,
        verified=report.verified,
        j=frac("j"),
        base=frac("base"),
        delta=frac("delta"),
        steps=terms.steps,
        batch=terms.batch,
        commits=sum(1 for c in closed if c.get("outcome") == "committed"),
        backend=chosen.name,
        seconds=time.monotonic() - started,
        replay_command=replay_command(cfg, run_id),
        optimizer_log=log_path.absolute(),
        failures=failures + [f"{c.name}: {c.detail}" for c in report.checks if not c.ok],
    )
    if not as_json:
        _print(summary)
    return summary


def _print(s: EvolveSummary) -> None:
    out = console()

    def pct(value: Fraction | None) -> str:
        return "-" if value is None else f"{float(value) * 100:.1f}%"

    verdict = "[bold green]VERIFIED[/]" if s.verified else "[bold red]NOT VERIFIED[/]"
    out.print(f"run {s.run_id}: {verdict}", soft_wrap=True)
    out.print(
        f"in-situ pass rate J {pct(s.j)}, Base (NONE run) {pct(s.base)}, "
        f"delta {'-' if s.delta is None else f'{float(s.delta) * 100:+.1f} %p'}"
    )
    out.print(f"{s.steps} steps of {s.batch} cases, {s.commits} commits; {s.backend} sandbox")
    for failure in s.failures:
        out.print(f"[red]{plain(failure)}[/]", soft_wrap=True)
    out.print(f"replay it: {plain(s.replay_command)}", soft_wrap=True)
