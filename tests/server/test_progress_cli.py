"""Progress of long commands: `run open` (while it scores the seed baseline), `eval` and
`nominate` (the held-out scoring) show their trials as a bar on a terminal's stderr,
cleared at the end; stdout gets only the result, and a pipe gets no bar."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

from .tinytask import CASES, write_task_folder

CONTROL = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    subprocess.run(_holedger(home, "init"), capture_output=True, check=True)
    return home


def _holedger(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "holedger.cli", "--home", str(home), *args]


def _on_terminal(argv: list[str], cwd: Path) -> tuple[int, bytes, bytes]:
    """Run ``argv`` with stderr on a pseudo-terminal and stdout on a pipe."""
    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS="120", TERM="xterm")
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    err = b""
    waiter = select.poll()  # not select(): descriptors past 1024 in a long session
    waiter.register(leader, select.POLLIN)
    while True:
        if not waiter.poll(120 * 1000):
            proc.kill()
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read() if proc.stdout else b""
    os.close(leader)
    return proc.wait(timeout=120), out, CONTROL.sub(b"", err)


def test_run_open_eval_and_nominate_show_their_trials_on_a_terminal(tmp_path: Path) -> None:
    task = write_task_folder(tmp_path / "task")
    home = _home(tmp_path)
    held_out = len(CASES["test"]) * 2  # K = 2

    code, out, err = _on_terminal(
        _holedger(home, "run", "open", "--task", str(task), "--backend", "process", "--json"),
        tmp_path,
    )
    assert code == 0, err
    run_id = json.loads(out)["run_id"]
    assert b"held-out trials (test, K each)" in err and f"{held_out}/{held_out}".encode() in err
    assert b"held-out trials" not in out

    code, out, err = _on_terminal(
        _holedger(home, "eval", run_id, "seed", "--split", "dev"), tmp_path
    )
    assert code == 0, err
    assert b"dev trials" in err and f"{len(CASES['dev'])}/{len(CASES['dev'])}".encode() in err
    assert b"dev trials" not in out and b"accepted" in out

    code, out, err = _on_terminal(_holedger(home, "nominate", run_id, "seed"), tmp_path)
    assert code == 0, err
    assert b"held-out trials (test, K each)" in err and f"{held_out}/{held_out}".encode() in err
    assert b"closed" in out


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
