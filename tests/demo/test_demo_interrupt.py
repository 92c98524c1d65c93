"""Ctrl-C of `holedger demo` at ten seeded points: afterwards every run is verified, or
is closed by one command (`holedger run abort`) and then verifies as aborted.

The demo runs on the tiny upper-casing task (a task folder given with `--task`: a few
cases, no model), so each run takes seconds. A point is the number of events the demo
has appended to the ledger when it is interrupted (a busy machine changes the timing, not
the point): from its first to past its last (the seed baseline, the search, the held-out
scoring, the replay). SIGINT
goes to the demo process alone, as `kill -INT` does (a terminal's Ctrl-C reaches its
process group; the sandboxes are in sessions of their own either way).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server.tinytask import write_task_folder

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

POINTS = 10
SEED = 24


def _holedger(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "holedger.cli", "--home", str(home), *args]


def _verdicts(home: Path, run_ids: list[str]) -> dict[str, str]:
    ledger = Ledger.open(Settings.resolve(home).ledger_url, None, create_tables=False)
    try:
        return {run_id: replay_run(ledger, run_id).verdict for run_id in run_ids}
    finally:
        ledger.close()


def _events(home: Path) -> int:
    """The events the home's ledger holds, all runs together."""
    path = Settings.resolve(home).home / "ledger.db"
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:  # `with db` only commits
        (count,) = db.execute("SELECT COUNT(*) FROM holedger_events").fetchone()
    return int(count)


def _run_ids(home: Path) -> list[str]:
    ledger = Ledger.open(Settings.resolve(home).ledger_url, None, create_tables=False)
    try:
        return ledger.run_ids()
    finally:
        ledger.close()


def test_ctrl_c_at_ten_points_leaves_every_run_finishable(tmp_path: Path) -> None:
    task = write_task_folder(tmp_path / "task")
    home = tmp_path / "home"
    subprocess.run(_holedger(home, "init"), capture_output=True, check=True)
    rng = random.Random(SEED)
    points = [rng.randint(1, 45) for _ in range(POINTS)]
    checked: set[str] = set()
    outcomes = []
    for point in points:
        delay = point  # named in the failures
        with open(tmp_path / "out.txt", "wb") as out, open(tmp_path / "err.txt", "wb") as err:
            proc = subprocess.Popen(
                _holedger(home, "demo", "--task", str(task)),
                stdout=out,
                stderr=err,
                cwd=tmp_path,
                env=dict(os.environ, COLUMNS="200"),
            )
            start = _events(home)
            while proc.poll() is None and _events(home) < start + point:
                time.sleep(0.05)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=600)
        stderr = (tmp_path / "err.txt").read_text(errors="replace")
        assert "Traceback" not in stderr, stderr[-3000:]
        # 130: interrupted; 0 or 1: it had ended (g above the band or not).
        assert code in (0, 1, 130), (delay, code, stderr[-3000:])
        if code == 130:
            assert "interrupted" in stderr, stderr[-2000:]

        # Every run: verified, or one command closes it and it then verifies as aborted.
        new = [r for r in _run_ids(home) if r not in checked]
        verdicts = _verdicts(home, new)
        for run_id, verdict in verdicts.items():
            if verdict == "failed":
                abort = subprocess.run(
                    _holedger(home, "run", "abort", run_id, "--reason", "test interrupt"),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                assert abort.returncode == 0, (delay, abort.stderr)
                assert "Traceback" not in abort.stderr
                verdict = _verdicts(home, [run_id])[run_id]
                assert verdict == "verified-aborted", (delay, run_id, stderr[-2000:])
                verdict = "aborted by hand"
            elif verdict == "verified-aborted":
                # Closed by the interrupted demo itself: its optimizer log is kept.
                log = Settings.resolve(home).reports_dir / f"{run_id}.optimizer.jsonl"
                assert log.is_file(), (delay, run_id)
            outcomes.append((delay, code, verdict))
            checked.add(run_id)
    kinds = {verdict for *_, verdict in outcomes}
    assert "verified-aborted" in kinds, outcomes  # some interrupts closed a run as aborted
    assert any(code == 130 for _, code, _ in outcomes), outcomes
    print(outcomes)
