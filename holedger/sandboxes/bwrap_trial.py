"""One trial in a bubblewrap sandbox (``Trial``: pipes, cgroup, network namespace, the
wait and the teardown), and the namespaces and cgroups made ahead for the next trial.
The backend (holedger.sandboxes.bwrap) builds the command line and runs a Trial."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import math
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from holedger.errors import SandboxError
from holedger.sandboxes import cgroups
from holedger.sandboxes.common import (
    Ending,
    Janitor,
    UnnamedIO,
    empty_dir,
    etc_dir,
    leftover_observation,
    pidns_members,
    pidns_of,
    proc_status,
    readable,
    trial_result,
)
from holedger.sandboxes.netns import NetnsServices
from holedger.sandboxes.runtime import Interpreter, build_runtime, host_interpreter
from holedger.sandboxes.seccomp import filter_for_host
from holedger.sandboxes.spec import (
    Limits,
    Observation,
    SandboxResult,
    SandboxSpec,
)

# Where the harness reads its stdin inside the sandbox (bwrap copies it there).
STDIN_PATH = "/run/holedger/stdin"
# Runs on the host when there is a v2 cgroup: moves itself into it ($1.. = the group's
# join files, up to "--"), then becomes bwrap, which so starts inside.
HOST_JOIN = 'for f; do shift; [ "$f" = -- ] && break; echo 0 >"$f" || exit 125; done; exec "$@"'
POLL_S = 0.05
_CHILD_PID = re.compile(rb'"child-pid":\s*(\d+)')


class NetnsPool:
    """One trial network namespace made ahead (loopback up, recorder bound), refilled by
    the janitor after each trial, off the trial's clock. Each namespace serves one trial."""

    def __init__(self) -> None:
        self._spare: NetnsServices | None = None
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    def take(self, relays: dict[int, Path]) -> NetnsServices:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None:
            return NetnsServices(relays, record=True)
        spare.relays = dict(relays)
        return spare

    def refill(self) -> None:
        with self._lock:
            if self._spare is not None or self._closed:
                return
        services = NetnsServices({}, record=True)
        try:
            services.prepare()
        except (OSError, SandboxError):
            services.close()
            return
        with self._lock:
            keep = self._spare is None and not self._closed
            if keep:
                self._spare = services
        if not keep:
            services.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()


class CgroupPool:
    """One trial cgroup made ahead (the directories; a trial sets its own limits), made
    again by the janitor after each trial, off the trial's clock."""

    def __init__(self, janitor: Janitor) -> None:
        self._janitor = janitor
        self._spare: cgroups.TrialCgroup | None = None
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    def take(self, label: str, limits: Limits) -> cgroups.TrialCgroup | None:
        with self._lock:
            spare, self._spare = self._spare, None
        manager = cgroups.manager()
        if spare is not None and spare.version != manager.version:
            self._janitor.submit(spare.remove)  # cgroups are no longer used (or differently)
            spare = None
        if spare is not None:
            try:
                manager.apply(spare, limits)
                return spare
            except OSError:  # removed meanwhile (garbage collection): make one now
                spare.remove()
        return manager.create(label, limits)

    def refill(self) -> None:
        with self._lock:
            if self._spare is not None or self._closed:
                return
        group = cgroups.manager().create("trial", None)
        if group is None:
            return
        with self._lock:
            keep = self._spare is None and not self._closed
            if keep:
                self._spare = group
        if not keep:
            group.remove()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.remove()


class TrialHost(Protocol):
    """What a trial uses of its backend (holedger.sandboxes.bwrap.BwrapBackend)."""

    sh: str | None
    use_seccomp: bool
    janitor: Janitor
    netns: NetnsPool
    cgroups: CgroupPool

    def build_argv(
        self,
        spec: SandboxSpec,
        *,
        interp: Interpreter,
        runtime: Path,
        etc: Path,
        empty: Path,
        seccomp_fd: int | None,
        info_fd: int,
        block_fd: int,
        stdin_fd: int,
    ) -> list[str]: ...

    def environment(self, spec: SandboxSpec) -> dict[str, str]: ...


@lru_cache(maxsize=1)
def _interp() -> Interpreter:
    return host_interpreter()


@lru_cache(maxsize=1)
def _runtime() -> Path:
    return build_runtime().resolve()


class Trial:
    """The state of one bwrap run (pipes, cgroup, services), torn down in ``run``."""

    def __init__(self, backend: TrialHost, spec: SandboxSpec) -> None:
        self.backend, self.spec, self.limits = backend, spec, spec.limits
        self.io: UnnamedIO | None = None
        self.fds: list[int] = []
        self.observations: list[Observation] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.cg: cgroups.TrialCgroup | None = None
        self.init_pid: int | None = None

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        self.fds += [r, w]
        return r, w

    def _high(self, fd: int) -> int:
        """A copy of ``fd`` numbered 10 or above, clear of the descriptors bwrap and the
        wrapper use by number; the original is closed."""
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        self.fds.append(high)
        self._close(fd)
        return high

    def _close(self, fd: int) -> None:
        if fd in self.fds:
            self.fds.remove(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _pidfd(self, pid: int) -> int | None:
        """A descriptor that becomes readable when process ``pid`` ends (None if it did)."""
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return None
        self.fds.append(fd)
        return fd

    def _socketpair(self) -> tuple[int, int]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = (a.detach(), b.detach())
        self.fds += fds
        return fds

    def _copy(self, fd: int) -> int:
        """A copy of ``fd`` numbered 10 or above, closed with the trial's descriptors."""
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        self.fds.append(high)
        return high

    def run(self) -> SandboxResult:
        services = self.backend.netns.take(self.spec.relays)
        try:
            return self._run(services)
        finally:
            if self.proc is not None and self.proc.returncode is None:
                # Only on an error: the sandbox never got as far as being reaped.
                self._kill(self.cg, self.init_pid, self.proc)
                _reap(self.proc, self.init_pid, deadline_s=5.0)
            self.observations[:0] = services.stop()
            for fd in list(self.fds):
                self._close(fd)
            if self.io is not None:
                self.io.close()
            # Nothing of the trial runs any more (checked above): the rest can wait.
            janitor = self.backend.janitor
            janitor.submit(services.close)
            janitor.submit(self.backend.netns.refill)
            if self.cg is not None:
                janitor.submit(self.cg.remove)
                janitor.submit(self.backend.cgroups.refill)

    def _rlimits(self) -> list[tuple[int, tuple[int, int]]]:
        cpu = max(1, math.ceil(self.limits.cpu_time_s))
        limits = [
            (resource.RLIMIT_CORE, (0, 0)),
            # soft below hard: SIGXCPU (status 152) at the limit, SIGKILL a second later
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        ]
        if self.cg is None:
            memory = self.limits.memory_mb * 1024 * 1024
            limits.append((resource.RLIMIT_AS, (memory, memory)))
        return limits

    def _confine(self, init: int) -> None:
        """Give the sandbox's init, still held at --block-fd, the trial's rlimits; the
        harness inherits them."""
        try:
            for which, value in self._rlimits():
                resource.prlimit(init, which, value)
        except ProcessLookupError:
            pass  # bwrap died during its setup: the status wait sees it end
        except OSError as exc:
            raise SandboxError(f"cannot set the sandbox's rlimits: {exc}") from exc

    def _run(self, services: NetnsServices) -> SandboxResult:
        start = time.monotonic()
        deadline = start + self.limits.wall_s
        self.io = io = UnnamedIO(self.limits, self.spec.stdin)
        program, _ = filter_for_host() if self.backend.use_seccomp else (None, "")
        seccomp_fd = None
        if program is not None:
            seccomp_fd, w = self._pipe()
            os.write(w, program)
            self._close(w)
            seccomp_fd = self._high(seccomp_fd)
        info_r, info_w = self._pipe()
        block_r, block_w = self._pipe()
        status_r, status_w = self._socketpair()
        info_w, block_r = self._high(info_w), self._high(block_r)
        stdin_fd = self._copy(io.stdin_fd)
        os.lseek(stdin_fd, 0, os.SEEK_SET)  # bwrap copies from the current offset
        argv = self.backend.build_argv(
            self.spec,
            interp=_interp(),
            runtime=_runtime(),
            etc=etc_dir(),
            empty=empty_dir(),
            seccomp_fd=seccomp_fd,
            info_fd=info_w,
            block_fd=block_r,
            stdin_fd=stdin_fd,
        )
        pass_fds = [fd for fd in (seccomp_fd, info_w, block_r, stdin_fd) if fd is not None]
        self.cg = cg = self.backend.cgroups.take(self.spec.label or "trial", self.limits)
        joined: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if cg is not None and cg.version == 1:
            # This thread spawns from inside the group (v1 moves one thread at a time).
            joined = cg.thread_joined()
        elif cg is not None:
            joins = [str(f) for f in cg.join_files]
            argv = [self.backend.sh or "/bin/sh", "-c", HOST_JOIN, "host", *joins, "--", *argv]
        with services.entered():
            # bwrap starts in the trial's new network namespace; the calling thread, which
            # waits for the whole trial, is the parent that --die-with-parent watches.
            with joined:
                self.proc = subprocess.Popen(
                    argv,
                    stdin=status_w,
                    stdout=io.stdout_fd,
                    stderr=io.stderr_fd,
                    pass_fds=pass_fds,
                    close_fds=True,
                    start_new_session=True,
                    # bwrap stays pid 1 inside the sandbox, where /proc/1/environ is
                    # readable: it carries the sandbox's environment alone, never the
                    # host's (keys, paths) nor its working directory (PWD).
                    env=self.backend.environment(self.spec),
                    cwd="/",
                )
            # While bwrap builds the sandbox: the namespace's relays and recorder ...
            services.bind()
        proc = self.proc
        for fd in (seccomp_fd, info_w, block_r, status_w, stdin_fd):
            if fd is not None:
                self._close(fd)
        # ... and the rlimits. Then the sandbox may run the harness.
        self.init_pid = init_pid = _read_child_pid(
            info_r, max(2.0, deadline - time.monotonic()), parent=proc.pid
        )
        init_fd = None
        if init_pid is not None:
            init_fd = self._pidfd(init_pid)
            self._confine(init_pid)
        else:
            try:  # no pid: it ended before making a sandbox (the status wait says so)
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                raise SandboxError("bwrap did not report the sandbox's pid in time") from None
        with contextlib.suppress(BrokenPipeError):
            os.write(block_w, b"x")
        self._close(block_w)
        # Connections wait in the sockets' queues until this thread serves them.
        services.start()

        status_text, timed_out, flooded = self._wait_status(io, status_r, deadline)
        ns = pidns_of(init_pid) if init_pid else None
        exit_status: int | None = None
        if status_text is not None and not timed_out and not flooded:
            exit_status = int(status_text) if status_text.strip().isdigit() else None
            if ns is not None and not _only_the_wrapper(cg, proc.pid, init_pid):
                members = pidns_members(ns, _candidates(cg))
                left = [m for m in members if m[1] > 2]
                if _wrapper_still_waits(members):
                    # A status while the harness still runs is not the wrapper's (the
                    # harness cannot reopen the socket; this stays a check): nothing it
                    # reported counts, and it stops now.
                    exit_status = None
                    self.observations.append(
                        Observation("sandbox_error", "exit status forged by the harness")
                    )
                    self._kill(cg, init_pid, proc)
                elif left:
                    self.observations.append(leftover_observation(left))
        elif status_text is None and not timed_out and not flooded:
            self.observations.append(
                Observation("sandbox_error", "the sandbox ended before the harness reported")
            )
        if timed_out or flooded:
            self._kill(cg, init_pid, proc)
        else:
            # The wrapper waits for good: killing the init ends the pid namespace (the
            # wrapper with it) at once, and bwrap has nothing more to do.
            self._kill(None, init_pid, proc)
        code, cpu_ms_rusage = _reap(proc, init_pid, deadline_s=5.0)
        if init_fd is not None:
            # The init dies with bwrap (--die-with-parent) and takes the namespace along;
            # once it is gone nothing of the sandbox is left for the cgroup sweep to find.
            readable(init_fd, 1.0)
        # The sweep finds nothing unless something outlived the namespace's end; only then
        # is there more to check.
        swept = cg.kill_all() if cg is not None else None
        if (swept is None or swept) and ns is not None and pidns_members(ns, _candidates(cg)):
            self._kill(cg, init_pid, proc)
            self.observations.append(Observation("sandbox_error", "processes survived teardown"))
        if exit_status is None and status_text is None and not timed_out and not flooded:
            exit_status = code
        wall_ms = int((time.monotonic() - start) * 1000)

        ending = Ending(
            exit_status=exit_status,
            timed_out=timed_out,
            oom=bool(cg and cg.oom_killed()),
            pids_hit=bool(cg and cg.pids_limit_hit()),
            flooded=flooded,
            wall_ms=wall_ms,
            cpu_ms=cg.cpu_ms() if cg is not None else cpu_ms_rusage,
        )
        return trial_result(
            io,
            self.limits,
            ending,
            self.observations,
            backend="bwrap",
            isolation="isolated",
            limits_by=cg.mode if cg is not None else "rlimit",
        )

    def _wait_status(
        self, io: UnnamedIO, status_r: int, deadline: float
    ) -> tuple[str | None, bool, bool]:
        """(status line or None, timed out, output flood)."""
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True, False
            if readable(status_r, min(POLL_S, left)):
                chunk = os.read(status_r, 64)
                if not chunk:
                    return (buf.decode().strip() or None), False, False
                buf += chunk
                if buf.endswith(b"\n"):
                    return buf.decode().strip(), False, False
            if io.flooded():
                return None, False, True

    def _kill(
        self, cg: cgroups.TrialCgroup | None, init_pid: int | None, proc: subprocess.Popen[bytes]
    ) -> None:
        if cg is not None:
            cg.kill_all()
        for pid in (init_pid, proc.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def _candidates(cg: cgroups.TrialCgroup | None) -> list[int] | None:
    """Where to look for the sandbox's processes: its cgroup, else all of /proc."""
    return cg.members() if cg is not None else None


def _only_the_wrapper(cg: cgroups.TrialCgroup | None, bwrap_pid: int, init_pid: int | None) -> bool:
    """Whether the trial's group holds bwrap, its init and the wrapper (pid 2 inside, the
    init's child) and nothing else: then nothing was left behind and the status is the
    wrapper's, without a scan of every member (everything a trial starts is in the group)."""
    if cg is None or init_pid is None:
        return False
    rest = [pid for pid in cg.members() if pid not in (bwrap_pid, init_pid)]
    if len(rest) != 1:
        return False
    status = proc_status(rest[0])
    inside = status.get("NSpid", "").split()[-1:]
    return inside == ["2"] and status.get("PPid") == str(init_pid)


def _wrapper_still_waits(members: list[tuple[int, int, str]]) -> bool:
    """Whether the wrapper (pid 2 inside) still has a child: the harness it runs.

    The wrapper reports only after reaping the harness, and the harness's own children go
    to pid 1 when it exits, so a live child of the wrapper means the report is forged."""
    wrapper = next((host for host, inside, _ in members if inside == 2), None)
    if wrapper is None:
        return False
    return any(
        proc_status(host).get("PPid") == str(wrapper) for host, inside, _ in members if inside > 2
    )


def _read_child_pid(info_r: int, timeout_s: float, parent: int | None = None) -> int | None:
    """bwrap's --info-fd JSON: {"child-pid": N, ...} (the pid namespace's init).

    bwrap writes the pid first, in one write, then the namespace ids, then closes its end;
    with ``parent`` (bwrap's pid) a pid seen in the first write is taken at once when it is
    bwrap's child, instead of waiting for the rest."""
    if not readable(info_r, timeout_s):
        return None
    data = b""
    while True:
        if data and parent is not None:
            early = _CHILD_PID.search(data)
            if early and proc_status(int(early.group(1))).get("PPid") == str(parent):
                return int(early.group(1))
        if not readable(info_r, 0.5):
            break
        chunk = os.read(info_r, 4096)
        if not chunk:
            break
        data += chunk
    try:
        pid = json.loads(data.decode()).get("child-pid")
    except (ValueError, UnicodeDecodeError):
        return None
    return pid if isinstance(pid, int) else None


def _reap(
    proc: subprocess.Popen[bytes], init_pid: int | None, deadline_s: float
) -> tuple[int | None, int | None]:
    """Wait for bwrap (killing it past the deadline); (exit code, CPU ms of the tree)."""
    if proc.returncode is not None:  # already reaped (it failed before making a sandbox)
        code = proc.returncode
        return (128 - code if code < 0 else code), None
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(proc.pid)
    end = time.monotonic() + deadline_s
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            left = end - time.monotonic()
            if left <= 0:
                for p in (init_pid, proc.pid):
                    if p:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(p, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            if pidfd is not None:
                readable(pidfd, left)  # readable once bwrap has exited
            else:
                time.sleep(0.001)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    cpu = int((usage.ru_utime + usage.ru_stime) * 1000)
    return (128 - code if code < 0 else code), cpu
