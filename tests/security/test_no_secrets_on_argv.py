"""No token on a command line: every local user can read /proc/PID/cmdline (``ps``), so
trial and optimizer tokens reach a sandbox through the environment only.

While a trial runs, the test reads the command line of every process on the host, again
and again, and looks for the token; it also checks that the token did reach the harness
(its environment) and that the scan saw the trial's processes at all.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from holedger.sandboxes.spec import Backend, Limits, SandboxResult, SandboxSpec

pytestmark = pytest.mark.slow

HARNESS = """
import os, sys, time
assert os.environ["OPENAI_API_KEY"] == os.environ["HOLEDGER_API_TOKEN"]
time.sleep(1.5)
print("done")
"""


def _cmdlines() -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    found[int(d)] = f.read()
            except OSError:
                pass
    return found


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.parametrize("name", ["bwrap", "docker"])
def test_no_token_in_any_command_line_while_trials_run(name: str, tmp_path: Path) -> None:
    from tests.sandboxes.conftest import backend_or_skip

    backend: Backend = backend_or_skip(name)
    code = tmp_path / "candidate"
    code.mkdir()
    (code / "harness.py").write_text(HARNESS)
    tokens = [f"hlg_{secrets.token_hex(16)}" for _ in range(2)]
    results: list[SandboxResult] = []

    def trial(token: str) -> None:
        spec = SandboxSpec(
            code_dir=code,
            argv=["python3", "harness.py", "--marker", "argv-visible"],
            env={"OPENAI_API_KEY": token, "HOLEDGER_API_TOKEN": token},
            limits=Limits(wall_s=30),
            label="argv-test",
        )
        results.append(backend.run(spec))

    threads = [threading.Thread(target=trial, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    leaked: dict[int, bytes] = {}
    harness_pids: set[int] = set()
    scans = 0
    while any(t.is_alive() for t in threads):
        for pid, cmd in _cmdlines().items():
            if any(tok.encode() in cmd for tok in tokens):
                leaked[pid] = cmd
            if b"argv-visible" in cmd and b"harness.py" in cmd:
                harness_pids.add(pid)
                env = _environ(pid)
                if env:
                    assert any(tok.encode() in env for tok in tokens)
        scans += 1
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert scans > 5
    assert not leaked, f"a token is on a command line: {leaked}"
    assert harness_pids, "the scan never saw a trial's harness"
    assert len(results) == 2
    for result in results:
        assert result.exit_status == 0, result.stderr
        assert result.stdout == b"done\n"
