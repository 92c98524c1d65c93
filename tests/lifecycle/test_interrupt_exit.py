"""An interrupted command exits 130 (as shells give a command SIGINT ended), never 1,
which is reserved for "verification failed"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# A command of the real `holedger` group that waits until it is interrupted.
PROGRAM = """
import sys, time
import click
from holedger.cli import cli

@cli.command("wait-here")
def wait_here():
    print("ready", flush=True)
    time.sleep(60)

cli(prog_name="holedger")
"""


def _interrupted(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_sigint_exits_130_with_one_line() -> None:
    done = _interrupted(["wait-here"])
    assert done.returncode == 130, done.stderr
    assert "holedger: interrupted" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_stopped_by_ctrl_c_exits_130_and_by_sigterm_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = [sys.executable, "-m", "holedger.cli", "--home", str(home)]
    subprocess.run([*base, "init"], capture_output=True, check=True)
    for sig, status in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        proc = subprocess.Popen(
            [*base, "serve", "--port", "0", "--gateway-port", "0", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["api"]  # serving
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == status, err
        assert "Traceback" not in err
