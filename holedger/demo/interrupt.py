"""What `holedger demo` does when it is interrupted (Ctrl-C, SIGINT): it asks nothing.

* During the seed baseline: the running held-out trials end (each within the task's case
  timeout) and nothing of that scoring is recorded; the baseline run stays pending, and the
  next ``holedger demo`` (or ``holedger run open`` of the task) finishes it. The message
  names it, and the one command that abandons it instead.
* During the search: the server takes no new evaluation or nomination (the optimizer gets
  503 and stops), the ones in flight are recorded, the optimizer's log is kept beside the
  reports, and the run is closed as aborted (``holedger run abort``), so it verifies as
  "VERIFIED (aborted)". A nomination in flight is scored to its end instead, closing the
  run as usual.
* A second interrupt stops at once; the message names the one command that closes the
  run then (``holedger run abort RUN --reason ...``).

The command then exits 130, as every interrupted holedger command does.
"""

from __future__ import annotations

import concurrent.futures
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from holedger.config import Settings
from holedger.demo.optimizer_log import replay_command, save_optimizer_log

if TYPE_CHECKING:
    from holedger.sandboxes.spec import SandboxResult

WHY = "interrupted (Ctrl-C) during holedger demo"
# How long the optimizer may take to stop once the server refuses it new work.
OPTIMIZER_STOP_S = 60.0


def opened_meanwhile(reader: Any, before: set[str]) -> str | None:
    """The demo's own run when it was recorded but not yet returned to the demo: the one
    open run, not a seed-baseline run, that was not in the ledger before."""
    from holedger.protocol.rules import BASELINE_OPTIMIZER

    try:
        found = [
            info.run_id
            for info in reader.runs()
            if info.run_id not in before
            and info.state == "open"
            and info.optimizer != BASELINE_OPTIMIZER
        ]
    except Exception:  # reading the ledger must not hide the interrupt
        return None
    return found[0] if len(found) == 1 else None


def abort_command(home_args: str, run_id: str) -> str:
    return f"holedger{home_args} run abort {run_id} --reason 'interrupted'"


@contextmanager
def second_interrupt_stops(
    say: Callable[[str], None], message: Callable[[], str]
) -> Iterator[None]:
    """While the interrupted demo records what ran, a second SIGINT stops the process at
    once, after printing ``message()`` (what is left, and the command that finishes it)."""

    def stop_now(*_: object) -> None:
        say(message())
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(130)

    previous = signal.signal(signal.SIGINT, stop_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted(
    cfg: Settings,
    server: Any,
    run_id: str | None,
    fut_opt: concurrent.futures.Future[SandboxResult] | None,
    say: Callable[[str], None],
) -> None:
    """Record what ran and close the run as aborted (see interrupt.py); then the caller
    re-raises the interrupt (exit 130)."""
    from holedger.output import plain
    from holedger.server.lifecycle import abort_run

    service = server.service
    default = cfg.home == Settings.resolve(".holedger").home
    home = "" if default else f" --home {shlex.quote(str(cfg.home))}"
    if run_id is None:
        pending = sorted(cfg.home.glob("baselines/*.pending"))
        if pending:
            base = pending[0].read_text().strip()
            say(
                f"interrupted: the seed baseline run {base} was cut short (none of its "
                "held-out scoring recorded); the next 'holedger demo' finishes it, or "
                f"'{abort_command(home, base)}' abandons it"
            )
        else:
            say("interrupted before any run was opened")
        return
    say(
        "interrupted: taking no new evaluation or nomination, recording those in flight "
        "(Ctrl-C again stops at once)"
    )
    left = f"run {run_id} is left open; close it with: {abort_command(home, run_id)}"
    with second_interrupt_stops(say, lambda: f"stopped at once: {left}"):
        service.drain()
        result: SandboxResult | None = None
        if fut_opt is not None:
            try:  # refused new work (503), the optimizer stops by itself
                result = fut_opt.result(timeout=OPTIMIZER_STOP_S)
            except (concurrent.futures.TimeoutError, Exception):
                result = None
        if result is not None:
            log_path = save_optimizer_log(cfg, run_id, result)
            say(f"optimizer log kept: {plain(log_path)}")
        elif fut_opt is not None:
            say("the optimizer did not stop in time: its log is not kept")
        state = service.state(run_id)
        if state.closed:
            say(f"run {run_id} was completed before the demo stopped")
        else:
            abort_run(service, run_id, WHY)
            say(f"run {run_id} closed as aborted: it verifies as 'VERIFIED (aborted)'")
        say(f"replay it: {plain(replay_command(cfg, run_id))}")
