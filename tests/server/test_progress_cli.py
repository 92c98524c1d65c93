"""Progress of long commands: `run open` (while it scores the seed baseline), `eval` and
`nominate` (the held-out scoring) show their trials as a bar on a terminal's stderr,
cleared at the end; stdout gets only the result, and a pipe gets no bar."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from terminal import run_on_terminal

from .tinytask import CASES, write_task_folder


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    subprocess.run(_holedger(home, "init"), capture_output=True, check=True)
    return home


def _holedger(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "holedger.cli", "--home", str(home), *args]


def test_run_open_eval_and_nominate_show_their_trials_on_a_terminal(tmp_path: Path) -> None:
    task = write_task_folder(tmp_path / "task")
    home = _home(tmp_path)
    held_out = len(CASES["test"]) * 2  # K = 2

    opened = run_on_terminal(
        _holedger(home, "run", "open", "--task", str(task), "--backend", "process", "--json"),
        tmp_path,
    )
    assert opened.code == 0, opened.err
    run_id = json.loads(opened.out)["run_id"]
    assert b"held-out trials (test, K each)" in opened.err
    assert f"{held_out}/{held_out}".encode() in opened.err
    assert b"held-out trials" not in opened.out

    dev = run_on_terminal(_holedger(home, "eval", run_id, "seed", "--split", "dev"), tmp_path)
    assert dev.code == 0, dev.err
    assert (
        b"dev trials" in dev.err and f"{len(CASES['dev'])}/{len(CASES['dev'])}".encode() in dev.err
    )
    assert b"dev trials" not in dev.out and b"accepted" in dev.out

    nominated = run_on_terminal(_holedger(home, "nominate", run_id, "seed"), tmp_path)
    assert nominated.code == 0, nominated.err
    assert b"held-out trials (test, K each)" in nominated.err
    assert f"{held_out}/{held_out}".encode() in nominated.err
    assert b"closed" in nominated.out


def test_a_pipe_gets_no_bar(tmp_path: Path) -> None:
    task = write_task_folder(tmp_path / "task")
    home = _home(tmp_path)
    opened = subprocess.run(
        _holedger(home, "run", "open", "--task", str(task), "--backend", "process", "--json"),
        capture_output=True,
        check=False,
    )
    assert opened.returncode == 0, opened.stderr
    assert b"trials" not in opened.stderr
    run_id = json.loads(opened.stdout)["run_id"]
    evaluated = subprocess.run(
        _holedger(home, "eval", run_id, "seed", "--split", "dev"), capture_output=True, check=False
    )
    assert evaluated.returncode == 0 and b"dev trials" not in evaluated.stderr
