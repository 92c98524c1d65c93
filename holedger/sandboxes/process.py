"""The process backend: NO ISOLATION. Opt-in only, and every trial says so.

The harness runs as a plain child process of holedger, with the host's filesystem and
network. It exists for machines where neither bwrap nor docker works, and every result
carries ``isolation="none"`` plus an ``unisolated_trial`` observation, so a ledger that
contains such a trial can never be mistaken for an isolated one.

What it still does: its own session, the wall-time limit, limits by cgroup when holedger
may make one (else rlimits: address space, CPU time; no process count when run as root),
a kill of every process of the trial at the end (by cgroup, else by a marker variable in
each process's environment), and relays bound on the host's own 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import subprocess
import time
from functools import lru_cache
from pathlib import Path

from holedger.errors import SandboxError
from holedger.sandboxes import cgroups
from holedger.sandboxes.common import (
    Ending,
    TrialIO,
    leftover_observation,
    sandbox_env,
    trial_result,
)
from holedger.sandboxes.netns import NetnsServices, host_relays
from holedger.sandboxes.runtime import Interpreter, build_runtime, host_interpreter
from holedger.sandboxes.spec import Observation, SandboxResult, SandboxSpec

MARKER = "HOLEDGER_TRIAL_MARKER"
RLIMIT_WRAPPER = 'while [ "$1" != -- ]; do ulimit "$1" "$2"; shift 2; done; shift; exec "$@"'
CGEXEC = 'for f; do shift; [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; exec "$@"'


def marked_processes(marker: str) -> list[int]:
    """Processes whose environment holds ``MARKER=marker`` (readable ones only)."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(d))
    return found


class ProcessBackend:
    """Trials as plain processes (no isolation)."""

    name = "process"

    def settle(self, timeout_s: float = 30.0) -> None:
        """Nothing is cleaned up off a trial's clock."""

    def close(self) -> None:
        """Nothing is made ahead of a trial."""

    def available(self) -> tuple[bool, str]:
        cg = cgroups.manager()
        limits = cg.reason if cg.usable else f"rlimits ({cg.reason})"
        return True, f"always (NO isolation: host filesystem and network); limits by {limits}"

    def run(self, spec: SandboxSpec) -> SandboxResult:
        if not Path(spec.code_dir).is_dir():
            raise SandboxError(f"code directory {spec.code_dir} does not exist")
        limits = spec.limits
        io = TrialIO(limits)
        io.prepare(spec.stdin)
        marker = secrets.token_hex(8)
        home = io.dir / "home"
        home.mkdir()
        exe = _interp().executable
        env = sandbox_env(spec, runtime_dir=str(_runtime()))
        env.update(
            {
                "PATH": f"{exe.parent}:/usr/local/bin:/usr/bin:/bin",
                "HOME": str(home),
                "TMPDIR": str(home),
                MARKER: marker,
            }
        )
        cg = cgroups.manager().create(spec.label or "trial", limits)
        cpu_s = max(1, math.ceil(limits.cpu_time_s))
        ulimits = [("-c", "0"), ("-St", str(cpu_s)), ("-Ht", str(cpu_s + 1))]
        if cg is None:
            ulimits.append(("-v", str(limits.memory_mb * 1024)))
        argv = ["/bin/sh", "-c", RLIMIT_WRAPPER, "rlimits"]
        argv += [x for pair in ulimits for x in pair] + ["--", *spec.argv]
        if cg is not None:
            argv = ["/bin/sh", "-c", CGEXEC, "cgexec", *map(str, cg.procs_files), "--", *argv]
        services: NetnsServices | None = None
        observations = [Observation("unisolated_trial", "process backend: no isolation")]
        start = time.monotonic()
        try:
            services = host_relays(spec.relays) if spec.relays else None
            with (
                open(io.stdin_path, "rb") as fin,
                open(io.stdout_path, "wb") as fout,
                open(io.stderr_path, "wb") as ferr,
            ):
                proc = subprocess.Popen(
                    argv,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    cwd=spec.code_dir,
                    env=env,
                    close_fds=True,
                    start_new_session=True,
                )
            timed_out = flooded = False
            deadline = start + limits.wall_s
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if io.flooded():
                    flooded = True
                    break
                time.sleep(0.005)
            if not timed_out and not flooded:
                left = cg.pids() if cg is not None else marked_processes(marker)
                if left:
                    names = [(p, p, _name(p)) for p in left]
                    observations.append(leftover_observation(names))
            self._kill_all(proc, cg, marker)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            code = proc.returncode
            exit_status = (
                None if timed_out or flooded or code is None else (128 - code if code < 0 else code)
            )
            ending = Ending(
                exit_status=exit_status,
                timed_out=timed_out,
                oom=bool(cg and cg.oom_killed()),
                pids_hit=bool(cg and cg.pids_limit_hit()),
                flooded=flooded,
                wall_ms=int((time.monotonic() - start) * 1000),
                cpu_ms=cg.cpu_ms() if cg is not None else None,
            )
            return trial_result(
                io,
                limits,
                ending,
                observations,
                backend="process",
                isolation="none",
                limits_by=cg.mode if cg is not None else "rlimit",
            )
        finally:
            if services is not None:
                services.close()
            if cg is not None:
                cg.remove()
            io.cleanup()

    @staticmethod
    def _kill_all(
        proc: subprocess.Popen[bytes], cg: cgroups.TrialCgroup | None, marker: str
    ) -> None:
        if cg is not None:
            cg.kill_all()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if cg is not None:
            return  # the cgroup held every process of the trial
        for _ in range(3):
            pids = marked_processes(marker)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)


@lru_cache(maxsize=1)
def _interp() -> Interpreter:
    return host_interpreter()


@lru_cache(maxsize=1)
def _runtime() -> Path:
    return build_runtime()


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
