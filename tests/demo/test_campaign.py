"""`holedger campaign`: a grid of runs, killed twice and resumed; bad grids refused.

The grid runs the example optimizer on the tiny upper-casing task (a task folder: a few
cases, no model), so each run takes seconds. The campaign is killed (SIGKILL, nothing
recorded on the way out) at two points counted in events appended to the ledger, and
started again each time; the third start finishes it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from server.tinytask import write_task_folder

from holedger.config import Settings
from holedger.demo.campaign_tasks import derived_task
from holedger.demo.grid import EXAMPLE_GRID, load_grid
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

GRID = """
[campaign]
name = "tiny-grid"
tasks = [TASK]
replicates = 2
concurrency = 2
workers = 2

[common]
harness = "example-greedy"
args = ["--dev-cases", "2", "--val-cases", "5", "--finalists", "1"]

[[optimizer]]
model = "alpha"
native = { harness = "alpha-singles", args = ["--strategy", "singles", "--val-cases", "5"] }

[[optimizer]]
model = "beta"
args = ["--order", "reverse"]
"""


def _holedger(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "holedger.cli", "--home", str(home), *args]


def _events(home: Path) -> int:
    db_path = Settings.resolve(home).home / "ledger.db"
    if not db_path.exists():
        return 0
    try:
        with sqlite3.connect(db_path, timeout=30) as db:
            (count,) = db.execute("SELECT COUNT(*) FROM holedger_events").fetchone()
    except sqlite3.OperationalError:  # the tables are not made yet
        return 0
    return int(count)


def _grid_file(tmp_path: Path, text: str = GRID) -> Path:
    task = write_task_folder(tmp_path / "task")
    path = tmp_path / "grid.toml"
    path.write_text(text.replace("TASK", repr(str(task))))
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_campaign_killed_twice_resumes_and_every_run_closes_and_verifies(
    tmp_path: Path,
) -> None:
    grid = _grid_file(tmp_path)
    home = tmp_path / "home"
    assert len(load_grid(grid).cells) == 6
    kills = []
    # Two kills, each some events after the campaign (re)started (the seed baseline
    # takes the first ones), then a start left to finish.
    for point in (60, 90, None):
        with open(tmp_path / "err.txt", "wb") as err:
            proc = subprocess.Popen(
                _holedger(home, "campaign", "run", str(grid)),
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
            start = _events(home)
            if point is not None:
                while proc.poll() is None and _events(home) < start + point:
                    time.sleep(0.02)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    kills.append(_events(home))
            code = proc.wait(timeout=600)
        stderr = (tmp_path / "err.txt").read_text(errors="replace")
        assert "Traceback" not in stderr, stderr[-3000:]
    assert code == 0, stderr[-3000:]
    assert len(kills) == 2, "the campaign ended before it could be killed twice"
    assert "resuming:" in stderr

    settings = Settings.resolve(home)
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        runs = [r for r in ledger.runs() if r.optimizer == "campaign:tiny-grid"]
        completed: Counter[tuple[object, ...]] = Counter()
        trial_ids: Counter[str] = Counter()
        for info in runs:
            report = replay_run(ledger, info.run_id)
            # Every run closed: completed and verified, or cut short and closed as aborted.
            assert info.state in ("closed", "aborted"), info
            expected = "verified" if info.state == "closed" else "verified-aborted"
            assert report.verdict == expected, (info.run_id, report.failed_checks())
            d = ledger.run_terms(info.run_id).descriptor
            assert d is not None
            if info.state == "closed":
                completed[(d.model, d.harness, d.harness_scope, d.replicate)] += 1
            for rec in ledger.records(info.run_id):
                if rec.type == "TrialCompleted":
                    trial_ids[str(rec.payload["trial_id"])] += 1
    finally:
        ledger.close()
    # Each of the 6 cells has exactly one completed run; no trial is recorded twice.
    assert len(completed) == 6 and set(completed.values()) == {1}, completed
    assert trial_ids and max(trial_ids.values()) == 1
    verify = subprocess.run(
        _holedger(home, "campaign", "verify", str(grid)), capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "the grid holds" in verify.stdout
    assert (settings.reports_dir / "campaign-tiny-grid.html").is_file()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda g: g.replace("tasks = [TASK]", 'tasks = ["no-such-task"]'), "unknown task"),
        (lambda g: g.replace('model = "beta"', 'model = "alpha"'), "duplicate cell"),
        (lambda g: g.replace("workers = 2", 'executor = "nomad://x"'), "campaign.executor"),
        (lambda g: g.replace("replicates = 2", "replicates = 0"), "campaign.replicates"),
        # the tiny task has 2 test cases
        (lambda g: g.replace("workers = 2", "workers = 2\ntest_cases = 3"), "test_cases = 3"),
        (lambda g: g.replace("workers = 2", "workers = 2\ntest_cases = 0"), "test_cases"),
        # nothing listens on port 1: refused before anything is made ("needs Ray" where
        # Ray is not installed)
        (lambda g: g.replace("workers = 2", 'executor = "ray://127.0.0.1:1"'), "Ray"),
    ],
)
def test_a_bad_grid_is_one_line_and_records_nothing(
    tmp_path: Path, edit: object, message: str
) -> None:
    grid = _grid_file(tmp_path, edit(GRID))  # type: ignore[operator]
    home = tmp_path / "home"
    proc = subprocess.run(
        _holedger(home, "campaign", "run", str(grid)), capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not home.exists()  # nothing made, nothing recorded


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_grid_with_test_cases_runs_on_a_copy_of_its_task_and_resumes_onto_it(
    tmp_path: Path,
) -> None:
    grid = _grid_file(tmp_path, GRID.replace("workers = 2", "workers = 2\ntest_cases = 1"))
    home = tmp_path / "home"
    for _ in range(2):  # the second start finds every cell done, on the same copy
        proc = subprocess.run(
            _holedger(home, "campaign", "run", str(grid)), capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming: 6 of 6 runs done before" in proc.stderr, proc.stderr
    settings = Settings.resolve(home)
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        runs = [r for r in ledger.runs() if r.optimizer == "campaign:tiny-grid"]
        terms = [ledger.run_terms(r.run_id).terms for r in runs]
        held_out = {
            rec.payload["case_id"]
            for r in runs
            for rec in ledger.records(r.run_id)
            if rec.type == "TrialCompleted" and rec.payload["split"] == "test"
        }
    finally:
        ledger.close()
    assert len(runs) == 6 and {r.state for r in runs} == {"closed"}
    # the tiny task's 2 test cases cut to 1 (every 2nd in id order: test-0), K as the task's
    assert {t.task_id for t in terms} == {"tiny-folder-test1"}
    assert {t.split_sizes["test"] for t in terms} == {1}
    assert held_out == {"test-0"}
    folder = settings.home / "campaigns" / "tasks" / "tiny-folder-test1"
    assert [c["id"] for c in json.loads((folder / "cases" / "test.json").read_text())] == ["test-0"]
    verify = subprocess.run(
        _holedger(home, "campaign", "verify", str(grid)), capture_output=True, text=True
    )
    assert verify.returncode == 0 and "the grid holds" in verify.stdout, verify.stdout


def test_a_tasks_copy_keeps_its_seed_dev_and_val_and_each_kinds_share_of_test(
    tmp_path: Path,
) -> None:
    from holedger.tasks import load_task

    made = [derived_task(Settings.resolve(tmp_path / h), "officeqa-lite", 16) for h in "ab"]
    # made again elsewhere, byte for byte the same task: a resumed campaign finds its runs
    assert [load_task(str(m)).digest for m in made] == [load_task(str(made[0])).digest] * 2
    copy, task = load_task(str(made[0])), load_task("officeqa-lite")
    assert copy.id == "officeqa-lite-test16" and copy.k == task.k == 3
    assert copy.spec.seed == task.spec.seed and copy.spec.verifier == task.spec.verifier
    for split in ("dev", "val"):
        assert copy.spec.splits.split_digests[split] == task.spec.splits.split_digests[split]
    test = {c.id: c for c in task.cases("test")}
    kept = copy.cases("test")
    assert len(kept) == 16 and all(test[c.id].expected == c.expected for c in kept)
    # 48 test cases; by (kind, id): cross_difference 6 (0-5), cross_sum 6 (6-11), difference
    # 8 (12-19), lookup 14 (20-33), pct_change 6 (34-39), sum 8 (40-47); every 3rd (0, 3,
    # ..., 45) keeps 2, 2, 3, 5, 2, 2 of them
    assert Counter(c.expected["kind"] for c in kept) == {
        "cross_difference": 2,
        "cross_sum": 2,
        "difference": 3,
        "lookup": 5,
        "pct_change": 2,
        "sum": 2,
    }


def test_the_example_grid_has_three_configurations_both_scopes_two_replicates() -> None:
    grid = load_grid(EXAMPLE_GRID)
    # held-out scoring on a copy of the task with 16 of its 48 test cases (48 trials a run)
    assert grid.tasks == ["officeqa-lite"] and grid.test_cases == 16
    models = {c.model for c in grid.cells}
    assert len(models) >= 3
    assert {c.scope for c in grid.cells} == {"native", "common"}
    assert {c.replicate for c in grid.cells} == {1, 2}
    assert grid.concurrency >= 2
    # every configuration differs from every other in what it runs
    assert len({c.args for c in grid.cells if c.replicate == 1}) == len(grid.cells) // 2
