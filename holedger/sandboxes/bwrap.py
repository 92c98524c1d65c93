"""The bubblewrap backend: the default on Linux.

One trial = one bwrap sandbox:

* namespaces: user (uid/gid 65534, no capabilities, no nested user namespaces), pid, ipc,
  uts, cgroup, mount, and a network namespace with only loopback that holedger creates and
  owns (see ``netns``); ``--die-with-parent`` and ``--new-session``;
* filesystem: an allowlist. ``/usr`` and the interpreter's own files read-only with every
  site-packages directory masked, the harness runtime at /opt/holedger/runtime, synthetic
  /etc files, the candidate read-only at /code (the cwd), a size-limited private /tmp;
* seccomp: holedger's own filter (``seccomp``);
* limits: a per-trial cgroup (v2 or v1) when holedger may make one, else rlimits;
* the whole tree dies at the timeout (cgroup freeze + kill, or the pid namespace's init).

Inside, a small sh wrapper (pid 2) runs the harness, reports its exit status on a pipe
and waits; holedger then lists what else still runs in the pid namespace (leftover
processes, ``process_left_behind``) before releasing the wrapper, whose exit ends the
namespace and kills the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import select
import shutil
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
    etc_dir,
    leftover_observation,
    pidns_members,
    pidns_of,
    proc_status,
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
    Observation,
    SandboxResult,
    SandboxSpec,
)

# Runs on the host as bwrap's parent: join the trial's cgroups, move the status pipe (its
# stdout) to fd 3 and the release pipe (its stdin) to fd 4, open the trial's stdin and
# stdout files, then become bwrap. $1 = stdin file, $2 = stdout file, $3.. = cgroup files.
HOST_WRAPPER = (
    'IN=$1 OUT=$2; shift 2; for f; do shift; [ "$f" = -- ] && break; '
    'echo $$ > "$f" || exit 125; done; exec 3>&1 4<&0 <"$IN" >"$OUT"; exec "$@"'
)
# Runs inside as pid 2 (fds 3 and 4 inherited through bwrap). $1.. = ulimit pairs, "--",
# argv. The harness gets neither fd, and its stderr stays apart from the wrapper's.
WRAPPER = (
    'while [ "$1" != -- ]; do ulimit "$1" "$2" 2>/dev/null; shift 2; done; shift; '
    'exec 5>&2 2>/dev/null; "$@" 2>&5 5>&- 3>&- 4<&-; rc=$?; echo "$rc" >&3; '
    "exec 3>&-; read _ <&4; exit $rc"
)
POLL_S = 0.05
# The whole environment of the host wrapper and of bwrap (both use absolute paths).
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


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


class BwrapBackend:
    """Trials in bubblewrap sandboxes."""

    name = "bwrap"

    def __init__(self, bwrap: str | None = None, seccomp: bool = True) -> None:
        self.bwrap = bwrap or _find("bwrap")
        self.sh = _find("sh")
        self.use_seccomp = seccomp
        self._available: tuple[bool, str] | None = None

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
        seccomp_fd: int | None,
        info_fd: int,
        rlimits: list[tuple[str, int]],
    ) -> list[str]:
        """The bwrap command line for ``spec`` (no side effects; unit-testable)."""
        assert self.bwrap
        a: list[str] = [
            self.bwrap,
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
        if seccomp_fd is None and _bwrap_version(self.bwrap) >= (0, 8):
            # The seccomp filter already denies new user namespaces, and this costs ~5 ms.
            a += ["--disable-userns"]
        a += ["--ro-bind", "/usr", "/usr"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / top
            if host.is_symlink():
                a += ["--symlink", os.readlink(host), f"/{top}"]
            elif host.is_dir():
                a += ["--ro-bind", str(host), f"/{top}"]
        for name in sorted(os.listdir(etc)):
            a += ["--ro-bind", str(etc / name), f"/etc/{name}"]
        if Path("/etc/ld.so.cache").is_file():
            a += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        a += ["--proc", "/proc", "--dev", "/dev"]
        a += ["--size", str(spec.limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        # /dev's own tmpfs has no size (half the host's memory): give /dev/shm /tmp's limit,
        # or without cgroups a harness could fill host memory through it.
        a += ["--perms", "1777", "--size", str(spec.limits.tmp_mb * 1024 * 1024)]
        a += ["--tmpfs", "/dev/shm"]
        visible = [Path("/usr"), interp.stdlib]
        a += ["--ro-bind", str(interp.stdlib), str(interp.stdlib)]
        if not _under(interp.executable, visible):
            a += ["--ro-bind", str(interp.executable), str(interp.executable)]
        if interp.shared_lib and not _under(interp.shared_lib, visible):
            a += ["--ro-bind", str(interp.shared_lib), str(interp.shared_lib)]
        extra = [Path(p).resolve() for p in spec.extra_ro_binds]
        for path in extra:
            a += ["--ro-bind", str(path), str(path)]
        for hidden in interp.hidden:
            if _under(hidden, visible + extra):
                a += ["--tmpfs", str(hidden), "--remount-ro", str(hidden)]
        a += ["--ro-bind", str(runtime), RUNTIME_DIR]
        a += ["--dir", BIN_DIR]
        for name in ("python3", "python"):
            a += ["--symlink", str(interp.executable), f"{BIN_DIR}/{name}"]
        a += ["--ro-bind", str(Path(spec.code_dir).resolve()), CODE_DIR, "--chdir", CODE_DIR]
        a += ["--clearenv"]
        for key, value in sorted(sandbox_env(spec).items()):
            a += ["--setenv", key, value]
        if seccomp_fd is not None:
            a += ["--seccomp", str(seccomp_fd)]
        a += ["--info-fd", str(info_fd)]
        a += ["--", "/bin/sh", "-c", WRAPPER, "wrapper"]
        for flag, amount in rlimits:
            a += [flag, str(amount)]
        a += ["--", *spec.argv]
        return a

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
    return build_runtime()


class _Trial:
    """The state of one bwrap run (pipes, cgroup, services), torn down in ``run``."""

    def __init__(self, backend: BwrapBackend, spec: SandboxSpec) -> None:
        self.backend, self.spec, self.limits = backend, spec, spec.limits
        self.io = TrialIO(spec.limits)
        self.fds: list[int] = []
        self.observations: list[Observation] = []

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        self.fds += [r, w]
        return r, w

    def _high(self, fd: int) -> int:
        """A copy of ``fd`` numbered 10 or above (the wrappers own fds 0 to 9)."""
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        self.fds.append(high)
        self._close(fd)
        return high

    def _close(self, fd: int) -> None:
        if fd in self.fds:
            self.fds.remove(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def run(self) -> SandboxResult:
        cg = cgroups.manager().create(self.spec.label or "trial", self.limits)
        services = NetnsServices(self.spec.relays, record=True)
        try:
            return self._run(cg, services)
        finally:
            observed = services.close()
            self.observations[:0] = observed
            if cg is not None:
                cg.remove()
            for fd in list(self.fds):
                self._close(fd)
            self.io.cleanup()

    def _run(self, cg: cgroups.TrialCgroup | None, services: NetnsServices) -> SandboxResult:
        start = time.monotonic()
        self.io.prepare(self.spec.stdin)
        program, _ = filter_for_host() if self.backend.use_seccomp else (None, "")
        seccomp_fd = None
        if program is not None:
            seccomp_fd, w = self._pipe()
            os.write(w, program)
            self._close(w)
        info_r, info_w = self._pipe()
        status_r, status_w = self._pipe()
        release_r, release_w = self._pipe()
        if seccomp_fd is not None:
            seccomp_fd = self._high(seccomp_fd)
        info_w = self._high(info_w)
        rlimits: list[tuple[str, int]] = [
            ("-c", 0),
            # soft below hard: SIGXCPU (status 152) at the limit, SIGKILL a second later
            ("-St", max(1, math.ceil(self.limits.cpu_time_s))),
            ("-Ht", max(1, math.ceil(self.limits.cpu_time_s)) + 1),
        ]
        if cg is None:
            rlimits.append(("-v", self.limits.memory_mb * 1024))
        argv = self.backend.build_argv(
            self.spec,
            interp=_interp(),
            runtime=_runtime().resolve(),
            etc=etc_dir().resolve(),
            seccomp_fd=seccomp_fd,
            info_fd=info_w,
            rlimits=rlimits,
        )
        procs = [str(f) for f in cg.procs_files] if cg is not None else []
        argv = [
            "/bin/sh",
            "-c",
            HOST_WRAPPER,
            "host",
            str(self.io.stdin_path),
            str(self.io.stdout_path),
            *procs,
            "--",
            *argv,
        ]
        pass_fds = [fd for fd in (seccomp_fd, info_w) if fd is not None]
        with open(self.io.stderr_path, "wb") as ferr:

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    argv,
                    stdin=release_r,
                    stdout=status_w,
                    stderr=ferr,
                    pass_fds=pass_fds,
                    close_fds=True,
                    start_new_session=True,
                    # bwrap stays pid 1 inside the sandbox, where /proc/1/environ is
                    # readable: it must not carry the host's environment (keys, paths)
                    # nor its working directory (PWD).
                    env=HOST_ENV,
                    cwd="/",
                )

            proc = services.setup_new(spawn)
        for fd in (seccomp_fd, info_w, status_w, release_r):
            if fd is not None:
                self._close(fd)

        deadline = start + self.limits.wall_s
        status_text, timed_out, flooded = self._wait_status(proc, status_r, deadline)
        init_pid = _read_child_pid(info_r)
        ns = pidns_of(init_pid) if init_pid else None
        exit_status: int | None = None
        if status_text is not None and not timed_out and not flooded:
            exit_status = int(status_text) if status_text.strip().isdigit() else None
            if ns is not None:
                members = pidns_members(ns, cg.pids() if cg is not None else None)
                left = [m for m in members if m[1] > 2]
                if _wrapper_still_waits(members):
                    # The harness wrote the status itself (it may open the wrapper's pipe
                    # through /proc/2/fd): nothing it reported counts, and it stops now.
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
        self._close(release_w)
        code, cpu_ms_rusage = _reap(proc, init_pid, deadline_s=5.0)
        if cg is not None:
            cg.kill_all()
        if ns is not None and pidns_members(ns, cg.pids() if cg is not None else None):
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
            self.io,
            self.limits,
            ending,
            self.observations,
            backend="bwrap",
            isolation="isolated",
            limits_by=cg.mode if cg is not None else "rlimit",
        )

    def _wait_status(
        self, proc: subprocess.Popen[bytes], status_r: int, deadline: float
    ) -> tuple[str | None, bool, bool]:
        """(status line or None, timed out, output flood)."""
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True, False
            ready, _, _ = select.select([status_r], [], [], min(POLL_S, left))
            if ready:
                chunk = os.read(status_r, 64)
                if not chunk:
                    return (buf.decode().strip() or None), False, False
                buf += chunk
                if buf.endswith(b"\n"):
                    return buf.decode().strip(), False, False
            if self.io.flooded():
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


def _read_child_pid(info_r: int) -> int | None:
    """bwrap's --info-fd JSON: {"child-pid": N, ...} (the pid namespace's init)."""
    ready, _, _ = select.select([info_r], [], [], 2.0)
    if not ready:
        return None
    data = b""
    while True:
        ready, _, _ = select.select([info_r], [], [], 0.5)
        if not ready:
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
    end = time.monotonic() + deadline_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.monotonic() > end:
            for p in (init_pid, proc.pid):
                if p:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.001)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    cpu = int((usage.ru_utime + usage.ru_stime) * 1000)
    return (128 - code if code < 0 else code), cpu
