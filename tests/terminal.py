"""Running a holedger command as a user at a terminal sees it: stderr on a pseudo-terminal
(where the progress bars are drawn), stdout on a pipe (where the result goes)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CONTROL = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class TerminalRun:
    code: int
    out: bytes  # stdout, a pipe
    err: bytes  # what the terminal showed, its control codes taken out


def run_on_terminal(
    argv: list[str], cwd: Path, *, columns: int = 120, timeout: float = 240.0
) -> TerminalRun:
    """Run ``argv`` with stderr on a pseudo-terminal and stdout on a pipe, reading both
    as they come (neither can fill up and stall the command). Fails the test when the
    command has not finished within ``timeout`` seconds."""
    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), TERM="xterm")
    try:
        with subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=follower, env=env
        ) as proc:
            os.close(follower)
            follower = -1
            assert proc.stdout is not None
            got = {leader: bytearray(), proc.stdout.fileno(): bytearray()}
            waiter = select.poll()  # not select(): it refuses descriptors past 1024
            for fd in got:
                waiter.register(fd, select.POLLIN)
            reading = set(got)
            deadline = time.monotonic() + timeout
            while reading:
                ready = waiter.poll(max(0.0, deadline - time.monotonic()) * 1000)
                if not ready:
                    proc.kill()
                    pytest.fail(f"{argv} did not finish within {timeout} s")
                for fd, _ in ready:
                    try:
                        chunk = os.read(fd, 65536)
                    except OSError:  # the terminal's other end closed: EIO
                        chunk = b""
                    if chunk:
                        got[fd] += chunk
                    else:
                        waiter.unregister(fd)
                        reading.discard(fd)
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            return TerminalRun(
                code, bytes(got[proc.stdout.fileno()]), CONTROL.sub(b"", bytes(got[leader]))
            )
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
