"""The docker backend's in-container entrypoint (pid 1). Standard library only.

Usage: python3 -I -S entry.py IN_DIR OUT_DIR -- ARGV...

1. Wait until the host has finished setting up the container's network namespace (relays
   and recorder), which it signals by creating IN_DIR/ready.
2. Run ARGV with stdin from IN_DIR/stdin and stdout/stderr into OUT_DIR/stdout and
   OUT_DIR/stderr (files, so no daemon can hold a pipe).
3. Write the exit status (128+N for signal N) to OUT_DIR/status, then wait to be killed,
   so the host can list whatever else still runs in the container before removing it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

READY_TIMEOUT_S = 60.0


def _detach(pid: int, sig: int) -> None:
    """Let go of a harness that made us its tracer, delivering the signal that stopped it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ptrace_detach = 17
    libc.ptrace(ctypes.c_long(ptrace_detach), ctypes.c_long(pid), None, ctypes.c_long(sig))


def main(args: list[str]) -> int:
    if len(args) < 4 or args[2] != "--":
        sys.stderr.write("usage: entry.py IN_DIR OUT_DIR -- ARGV...\n")
        return 2
    in_dir, out_dir, argv = args[0], args[1], args[3:]
    end = time.monotonic() + READY_TIMEOUT_S
    while not os.path.exists(os.path.join(in_dir, "ready")):
        if time.monotonic() > end:
            return 125
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:
        try:
            fds = [
                os.open(os.path.join(in_dir, "stdin"), os.O_RDONLY),
                os.open(os.path.join(out_dir, "stdout"), os.O_WRONLY | os.O_TRUNC),
                os.open(os.path.join(out_dir, "stderr"), os.O_WRONLY | os.O_TRUNC),
            ]
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"entry: cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        if os.WIFSTOPPED(status):  # the harness asked to be traced by us (PTRACE_TRACEME)
            _detach(pid, os.WSTOPSIG(status))
            continue
        break
    code = os.waitstatus_to_exitcode(status)
    rc = 128 - code if code < 0 else code
    fd = os.open(os.path.join(out_dir, "status"), os.O_WRONLY | os.O_TRUNC)
    os.write(fd, f"{rc}\n".encode())
    os.close(fd)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
