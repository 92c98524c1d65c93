"""The bubblewrap backend: the default on Linux.

One trial = one bwrap sandbox:

* namespaces: user (uid/gid 65534, no capabilities, no nested user namespaces), pid, ipc,
  uts, cgroup, mount, and a network namespace with only loopback that holedger creates and
  owns (see ``netns``); ``--die-with-parent`` and ``--new-session``;
* filesystem: an allowlist. ``/usr`` and the interpreter's own files read-only with every
  site-packages directory masked, the harness runtime at /opt/holedger/runtime, synthetic
  /etc files, the candidate read-only at /code (the cwd), a size-limited private /tmp and
  /dev/shm, five device nodes in an otherwise read-only /dev;
* seccomp: holedger's own filter (``seccomp``);
* limits: a per-trial cgroup (v2 or v1) when holedger may make one, else rlimits;
* the whole tree dies at the timeout (cgroup freeze + kill, or the pid namespace's init).

holedger starts bwrap from the calling thread (the parent ``--die-with-parent`` watches),
moved for the moment into the trial's network namespace (made ahead, or made now) and,
with cgroup v1, into the trial's group (made ahead too); with v2 a small sh step first
moves itself into the group, then becomes bwrap. While bwrap builds the sandbox, holedger
binds the relays (and the recorder, unless made ahead) in the namespace; bwrap waits at
``--block-fd`` until holedger has given the sandbox's init the trial's rlimits, so the
harness starts confined.

Inside, a small sh wrapper (pid 2) runs the harness, reports its exit status over a
socket the harness cannot reopen, and waits; holedger then lists what else still runs in
the pid namespace (leftover processes, ``process_left_behind``) and kills the namespace's
init, which takes everything else along. Removing the cgroup and closing the sockets
happen off the trial's clock.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from functools import lru_cache
from pathlib import Path

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
    sandbox_env,
    trial_result,
)
from holedger.sandboxes.netns import NetnsServices
from holedger.sandboxes.runtime import Interpreter, build_runtime, host_interpreter
from holedger.sandboxes.seccomp import filter_for_host
from holedger.sandboxes.spec import (
    BIN_DIR,
    CODE_DIR,
    RUNTIME_DIR,
    SANDBOX_GID,
    SANDBOX_UID,
    Limits,
    Observation,
    SandboxResult,
    SandboxSpec,
)

# Runs inside as pid 2: runs the harness, reports its exit status, then waits for good
# (holedger ends the sandbox). bwrap's stdin is the status channel, one end of a socket
# pair: a socket cannot be reopened through /proc/PID/fd, so the harness cannot write a
# status of its own there. The harness gets its stdin from STDIN_PATH, bwrap's stdout and
# stderr (the trial's output files), and no other descriptor.
STDIN_PATH = "/run/holedger/stdin"
WRAPPER = (
    f'exec 3<&0 <{STDIN_PATH} 5>&2 2>/dev/null; "$@" 2>&5 5>&- 3>&-; rc=$?; echo "$rc" >&3; '
    "read _ <&3; exit $rc"
)
# Runs on the host when there is a v2 cgroup: moves itself into it ($1.. = the group's
# join files, up to "--"), then becomes bwrap, which so starts inside.
HOST_JOIN = 'for f; do shift; [ "$f" = -- ] && break; echo 0 >"$f" || exit 125; done; exec "$@"'
POLL_S = 0.05
# The device nodes a sandbox gets (no tty: a trial has no controlling terminal).
DEV_NODES = ("null", "zero", "full", "random", "urandom")
_CHILD_PID = re.compile(rb'"child-pid":\s*(\d+)')


class _NetnsPool:
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


class _CgroupPool:
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


def _find(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/bin/{name}") if os.access(p, os.X_OK)), None
    )


@lru_cache(maxsize=1)
def _bwrap_version(path: str) -> tuple[int, ...]:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    digits = out.stdout.strip().split()[-1] if out.stdout.strip() else "0"
    return tuple(int(x) for x in digits.split(".") if x.isdigit())


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _interpreter_lib(interp: Interpreter) -> Path:
    """What to bind for the standard library: its parent directory (one mount for it and
    libpython) when that holds only the interpreter's own files, else the stdlib alone."""
    parent = interp.stdlib.parent
    if interp.shared_lib is None or interp.shared_lib.parent != parent:
        return interp.stdlib
    try:
        for entry in os.scandir(parent):
            if entry.name == "pkgconfig" and entry.is_dir(follow_symlinks=False):
                if all(n.startswith("python") for n in os.listdir(entry.path)):
                    continue
            elif entry.path == str(interp.stdlib) or entry.name.startswith("libpython"):
                continue
            return interp.stdlib
    except OSError:
        return interp.stdlib
    return parent


@lru_cache(maxsize=16)
def _static_args(
    bwrap: str,
    interp: Interpreter,
    runtime: Path,
    etc: Path,
    empty: Path,
    tmp_mb: int,
    extra: tuple[Path, ...],
    disable_userns: bool,
) -> tuple[str, ...]:
    """The part of bwrap's command line that is the same for every trial of a setup."""
    a: list[str] = [
        bwrap,
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    if disable_userns:
        # The seccomp filter already denies new user namespaces, and this costs ~5 ms.
        a += ["--disable-userns"]
    a += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            a += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            a += ["--ro-bind", str(host), f"/{top}"]
    a += ["--ro-bind", str(etc), "/etc"]  # one mount: every bind costs bwrap ~0.3 ms
    a += ["--proc", "/proc"]
    # A minimal /dev on the root (read-only at the end): the device nodes, not bwrap's
    # --dev (a writable tmpfs without a size, six nodes, a devpts instance).
    for node in DEV_NODES:
        if Path(f"/dev/{node}").is_char_device():
            a += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        a += ["--symlink", f"/proc/self/fd/{fd}", f"/dev/{name}"]
    a += ["--symlink", "/proc/self/fd", "/dev/fd"]
    a += ["--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    # Writable, so sized like /tmp: without cgroups a harness could otherwise fill host
    # memory through it.
    a += ["--perms", "1777", "--size", str(tmp_mb * 1024 * 1024)]
    a += ["--tmpfs", "/dev/shm"]
    lib = _interpreter_lib(interp)
    visible = [Path("/usr"), lib]
    a += ["--ro-bind", str(lib), str(lib)]
    if not _under(interp.executable, visible):
        a += ["--ro-bind", str(interp.executable), str(interp.executable)]
    if interp.shared_lib and not _under(interp.shared_lib, visible):
        a += ["--ro-bind", str(interp.shared_lib), str(interp.shared_lib)]
    for path in extra:
        a += ["--ro-bind", str(path), str(path)]
    for hidden in interp.hidden:
        if _under(hidden, visible + list(extra)):
            a += ["--ro-bind", str(empty), str(hidden)]
    a += ["--ro-bind", str(runtime), RUNTIME_DIR]
    a += ["--dir", BIN_DIR]
    for name in ("python3", "python"):
        a += ["--symlink", str(interp.executable), f"{BIN_DIR}/{name}"]
    return tuple(a)


class BwrapBackend:
    """Trials in bubblewrap sandboxes."""

    name = "bwrap"

    def __init__(self, bwrap: str | None = None, seccomp: bool = True) -> None:
        self.bwrap = bwrap or _find("bwrap")
        self.sh = _find("sh")
        self.use_seccomp = seccomp
        self._available: tuple[bool, str] | None = None
        # Set-up made ahead for the next trial, and the clean-up of finished ones, both
        # off the trials' clock.
        self.janitor = Janitor()
        self.netns = _NetnsPool()
        self.cgroups = _CgroupPool(self.janitor)

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until the teardown queued by finished trials is done."""
        self.janitor.drain(timeout_s)

    def close(self) -> None:
        """Remove the namespace and cgroup made ahead for a next trial."""
        self.settle()
        self.netns.close()
        self.cgroups.close()

    # ------------------------------------------------------------------ availability

    def available(self) -> tuple[bool, str]:
        if self._available is None:
            self._available = self._probe()
        return self._available

    def _probe(self) -> tuple[bool, str]:
        if not self.bwrap:
            return False, "bwrap not found (apt-get install bubblewrap)"
        if not self.sh:
            return False, "sh not found"
        if os.geteuid() != 0:
            return False, "needs root: holedger builds each trial's network namespace itself"
        try:
            version = _bwrap_version(self.bwrap)
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"bwrap does not run: {exc}"
        probe = subprocess.run(
            [
                self.bwrap,
                "--unshare-all",
                "--unshare-user",
                "--uid",
                str(SANDBOX_UID),
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/bin",
                "/bin",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
                "--",
                "/usr/bin/true",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            return False, f"bwrap cannot make namespaces: {probe.stderr.strip()[:200]}"
        cg = cgroups.manager()
        limits = cg.reason if cg.usable else f"rlimits ({cg.reason})"
        _, sec = filter_for_host()
        return True, f"bwrap {'.'.join(map(str, version))}; limits by {limits}; {sec}"

    # ------------------------------------------------------------------ argv

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
    ) -> list[str]:
        """The bwrap command line for ``spec`` (no side effects; unit-testable).

        bwrap copies the trial's stdin from ``stdin_fd`` to STDIN_PATH; ``block_fd``
        holds the sandbox back, set up, until holedger has given it its rlimits."""
        assert self.bwrap
        extra = tuple(Path(p).resolve() for p in spec.extra_ro_binds)
        disable_userns = seccomp_fd is None and _bwrap_version(self.bwrap) >= (0, 8)
        a = list(
            _static_args(
                self.bwrap, interp, runtime, etc, empty, spec.limits.tmp_mb, extra, disable_userns
            )
        )
        a += ["--ro-bind", str(Path(spec.code_dir).resolve()), CODE_DIR, "--chdir", CODE_DIR]
        a += ["--dir", str(Path(STDIN_PATH).parent), "--perms", "0444"]
        a += ["--file", str(stdin_fd), STDIN_PATH]
        # Last: the root itself (a tmpfs without a size) read-only, or a harness could fill
        # host memory through it when there is no cgroup.
        a += ["--remount-ro", "/"]
        # No environment here: bwrap's command line is readable by every local user
        # (/proc/PID/cmdline), and the environment carries the trial's token. bwrap gets
        # the sandbox's environment as its own (see ``environment``) and passes it on.
        if seccomp_fd is not None:
            a += ["--seccomp", str(seccomp_fd)]
        a += ["--info-fd", str(info_fd), "--block-fd", str(block_fd)]
        a += ["--", "/bin/sh", "-c", WRAPPER, "wrapper", *spec.argv]
        return a

    @staticmethod
    def environment(spec: SandboxSpec) -> dict[str, str]:
        """bwrap's own environment, which it hands to the sandbox unchanged: the harness's
        whole environment. Tokens travel here, never on the command line; a process's
        environment is readable only by its own user (and bwrap's init, pid 1 inside,
        carries just this)."""
        return sandbox_env(spec)

    # ------------------------------------------------------------------ run

    def run(self, spec: SandboxSpec) -> SandboxResult:
        ok, why = self.available()
        if not ok:
            raise SandboxError(f"the bwrap backend is unavailable: {why}")
        if not Path(spec.code_dir).is_dir():
            raise SandboxError(f"code directory {spec.code_dir} does not exist")
        for sock in spec.relays.values():
            if not Path(sock).exists():
                raise SandboxError(f"relay target {sock} does not exist")
        try:
            return _Trial(self, spec).run()
        except OSError as exc:
            raise SandboxError(f"the bwrap sandbox failed to start: {exc}") from exc


@lru_cache(maxsize=1)
def _interp() -> Interpreter:
    return host_interpreter()


@lru_cache(maxsize=1)
def _runtime() -> Path:
    return build_runtime().resolve()


class _Trial:
    """The state of one bwrap run (pipes, cgroup, services), torn down in ``run``."""

    def __init__(self, backend: BwrapBackend, spec: SandboxSpec) -> None:
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
