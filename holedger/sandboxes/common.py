"""Pieces every backend shares: the environment, output files, process scans, /etc files."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import queue
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from holedger.sandboxes.runtime import cache_root
from holedger.sandboxes.spec import (
    RUNTIME_DIR,
    SANDBOX_PATH,
    Limits,
    Observation,
    SandboxResult,
    SandboxSpec,
)

# Output beyond this many times the cap ends the trial: the files live on the host's disk.
OUTPUT_FLOOD_FACTOR = 8

ETC_FILES = {
    "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/tmp:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost\n",
    "resolv.conf": "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}


def sandbox_env(spec: SandboxSpec, runtime_dir: str = RUNTIME_DIR) -> dict[str, str]:
    """The basics every harness gets, overlaid by ``spec.env`` (the only other variables)."""
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": runtime_dir,
        "PYTHONDONTWRITEBYTECODE": "1",
        # No user site directory: it would be under HOME (/tmp, the harness's own), and
        # looking for it and for usercustomize costs every interpreter start ~1 ms.
        "PYTHONNOUSERSITE": "1",
    }
    env.update(spec.env)
    return env


LOADER_CACHE = Path("/etc/ld.so.cache")
_ETC_DIRS: dict[str, Path] = {}
_EMPTY_DIRS: dict[str, Path] = {}


def etc_dir() -> Path:
    """A cached directory holding the /etc a sandbox sees: the synthetic files and a copy
    of the host's loader cache, so that one read-only mount gives all of it.

    Keyed by the synthetic files and the loader cache's identity (ldconfig replaces the
    file, so a new inode, size or time makes a new directory)."""
    digest = hashlib.sha256(json.dumps(ETC_FILES, sort_keys=True).encode()).hexdigest()[:12]
    try:
        st = LOADER_CACHE.stat()
        key = f"{digest}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
    except OSError:
        key = f"{digest}-none"
    base = cache_root()
    known = _ETC_DIRS.get(f"{base}/{key}")
    if known is not None:
        return known
    root = base / f"sandbox-etc-{key}"
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".etc-", dir=root.parent))
        for name, text in ETC_FILES.items():
            (work / name).write_text(text)
        if not key.endswith("-none"):
            shutil.copyfile(LOADER_CACHE, work / LOADER_CACHE.name)
        for f in work.iterdir():
            os.chmod(f, 0o644)
        os.chmod(work, 0o755)
        try:
            os.rename(work, root)
        except OSError:
            shutil.rmtree(work, ignore_errors=True)
        for old in root.parent.glob(f"sandbox-etc-{digest}-*"):  # superseded loader caches
            if old != root:
                shutil.rmtree(old, ignore_errors=True)
    _ETC_DIRS[f"{base}/{key}"] = root = root.resolve()
    return root


def empty_dir() -> Path:
    """A cached empty directory, mounted read-only over what a sandbox must not see."""
    base = cache_root()
    known = _EMPTY_DIRS.get(str(base))
    if known is not None:
        return known
    root = base / "sandbox-empty-1"
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".empty-", dir=root.parent))
        os.chmod(work, 0o755)
        try:
            os.rename(work, root)
        except OSError:
            work.rmdir()
    _EMPTY_DIRS[str(base)] = root = root.resolve()
    return root


@dataclass
class TrialIO:
    """stdin, stdout and stderr of one trial as files in a private host directory.

    Files, not pipes: a process that escapes the harness could hold a pipe open and hang
    the reader; a file is read after the trial whatever still holds it.
    """

    limits: Limits
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="holedger-trial-")))

    def __post_init__(self) -> None:
        self.stdin_path = self.dir / "stdin"
        self.stdout_path = self.dir / "stdout"
        self.stderr_path = self.dir / "stderr"

    def prepare(self, stdin: bytes) -> None:
        self.stdin_path.write_bytes(stdin)
        self.stdout_path.touch()
        self.stderr_path.touch()

    def flooded(self) -> bool:
        cap = self.limits.output_bytes * OUTPUT_FLOOD_FACTOR + 65536
        for p in (self.stdout_path, self.stderr_path):
            with contextlib.suppress(OSError):
                if p.stat().st_size > cap:
                    return True
        return False

    def collect(self, path: Path) -> tuple[bytes, bool]:
        cap = self.limits.output_bytes
        try:
            with open(path, "rb") as f:
                data = f.read(cap + 1)
        except OSError:
            return b"", False
        return data[:cap], len(data) > cap

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def outputs(self) -> tuple[tuple[bytes, bool], tuple[bytes, bool]]:
        """(stdout, truncated) and (stderr, truncated), each cut at the cap."""
        return self.collect(self.stdout_path), self.collect(self.stderr_path)


class UnnamedIO:
    """stdin, stdout and stderr of one trial as unnamed in-memory files, held open.

    Files for the same reason as :class:`TrialIO`, but with no directory to make or remove
    (they vanish when closed), and in memory: what a harness writes is charged to its
    cgroup. A sandbox reaches them through descriptors it inherits.
    """

    def __init__(self, limits: Limits, stdin: bytes) -> None:
        self.limits = limits
        fds: list[int] = []
        try:
            for name in ("stdin", "stdout", "stderr"):
                fds.append(_unnamed_file(name))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        self.stdin_fd, self.stdout_fd, self.stderr_fd = fds
        view = memoryview(stdin)
        while view:
            view = view[os.write(self.stdin_fd, view) :]

    def flooded(self) -> bool:
        cap = self.limits.output_bytes * OUTPUT_FLOOD_FACTOR + 65536
        return any(os.fstat(fd).st_size > cap for fd in (self.stdout_fd, self.stderr_fd))

    def _collect(self, fd: int) -> tuple[bytes, bool]:
        cap = self.limits.output_bytes
        data = b""
        while len(data) <= cap:
            chunk = os.pread(fd, cap + 1 - len(data), len(data))
            if not chunk:
                break
            data += chunk
        return data[:cap], len(data) > cap

    def outputs(self) -> tuple[tuple[bytes, bool], tuple[bytes, bool]]:
        return self._collect(self.stdout_fd), self._collect(self.stderr_fd)

    def close(self) -> None:
        for fd in (self.stdin_fd, self.stdout_fd, self.stderr_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def readable(fd: int, timeout_s: float) -> bool:
    """Wait until ``fd`` is readable (or closed at the other end), at most ``timeout_s``.

    ``poll``, not ``select``: select() refuses descriptors numbered 1024 and up, which a
    long-running server (or a test process) reaches.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


def _unnamed_file(name: str) -> int:
    """A new read-write file with no name: a memfd, else a file in a private temporary
    directory, unlinked at once."""
    with contextlib.suppress(OSError, AttributeError):
        return os.memfd_create(f"holedger-{name}", os.MFD_CLOEXEC)
    work = tempfile.mkdtemp(prefix="holedger-io-")
    try:
        path = os.path.join(work, name)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(path)
        return fd
    finally:
        os.rmdir(work)


class TrialOutputs(Protocol):
    """What :func:`trial_result` reads a trial's output from."""

    def outputs(self) -> tuple[tuple[bytes, bool], tuple[bytes, bool]]: ...


def proc_status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return out
    try:
        data = os.read(fd, 16384)  # one read: the whole file, as procfs generates it
    except OSError:
        return out
    finally:
        os.close(fd)
    for line in data.decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def pidns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def pidns_members(ns: str, candidates: list[int] | None = None) -> list[tuple[int, int, str]]:
    """Live (not zombie) processes in pid namespace ``ns``: (host pid, pid inside, name)."""
    pids = candidates
    if pids is None:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    found = []
    for pid in pids:
        if pidns_of(pid) != ns:
            continue
        status = proc_status(pid)
        if not status or status.get("State", "").startswith(("Z", "X")):
            continue
        nspid = status.get("NSpid", str(pid)).split()
        found.append((pid, int(nspid[-1]), status.get("Name", "?")))
    return found


def leftover_observation(left: list[tuple[int, int, str]]) -> Observation:
    names = ", ".join(sorted({name for _, _, name in left}))
    return Observation(
        "process_left_behind",
        f"{len(left)} process(es) still running after the harness exited: {names}",
    )


class Janitor:
    """Runs steps off the trial's clock (removing a dead trial's cgroup, closing its sockets,
    making the next trial's network namespace), in order, on one daemon thread; what is
    queued is drained when the interpreter exits.

    Whatever a crash leaves is found later by ``holedger sandbox gc`` (empty cgroups)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Callable[[], object]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, step: Callable[[], object]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="holedger-janitor", daemon=True
                )
                self._thread.start()
                atexit.register(self.drain)
        self._queue.put(step)

    def _work(self) -> None:
        while True:
            step = self._queue.get()
            with contextlib.suppress(Exception):
                step()
            self._queue.task_done()

    def drain(self, timeout_s: float = 30.0) -> None:
        end = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.002)


SIGXCPU_STATUS = 128 + 24  # the exit status of a process killed at its CPU-time rlimit


def limit_observations(
    *,
    timed_out: bool,
    oom: bool,
    pids_hit: bool,
    wall_s: float,
    memory_mb: int,
    pids: int,
    exit_status: int | None = None,
    cpu_s: float | None = None,
) -> list[Observation]:
    out = []
    if timed_out:
        out.append(Observation("timeout", f"killed at the {wall_s:g} s wall-time limit"))
    elif exit_status == SIGXCPU_STATUS and cpu_s is not None:
        out.append(Observation("timeout", f"killed at the {cpu_s:g} s CPU-time limit"))
    if oom:
        out.append(Observation("out_of_memory", f"killed at the {memory_mb} MiB memory limit"))
    if pids_hit:
        out.append(Observation("process_limit", f"hit the limit of {pids} processes"))
    return out


def truncation_observations(out_trunc: bool, err_trunc: bool, cap: int) -> list[Observation]:
    streams = [n for n, t in (("stdout", out_trunc), ("stderr", err_trunc)) if t]
    if not streams:
        return []
    return [Observation("output_truncated", f"{' and '.join(streams)} cut at {cap} bytes")]


@dataclass(frozen=True)
class Ending:
    """How a trial ended, as a backend observed it; :func:`trial_result` does the rest."""

    exit_status: int | None
    timed_out: bool
    oom: bool
    pids_hit: bool
    flooded: bool
    wall_ms: int
    cpu_ms: int | None


def trial_result(
    io: TrialOutputs,
    limits: Limits,
    ending: Ending,
    observations: list[Observation],
    *,
    backend: str,
    isolation: Literal["isolated", "none"],
    limits_by: str,
) -> SandboxResult:
    """Collect the capped output and derive the limit observations; the one result shape.

    ``observations`` (what the backend saw during the run) is extended in place.
    """
    (stdout, out_trunc), (stderr, err_trunc) = io.outputs()
    observations += limit_observations(
        timed_out=ending.timed_out,
        oom=ending.oom,
        pids_hit=ending.pids_hit,
        wall_s=limits.wall_s,
        memory_mb=limits.memory_mb,
        pids=limits.pids,
        exit_status=ending.exit_status,
        cpu_s=limits.cpu_time_s,
    )
    if ending.flooded:
        observations.append(Observation("output_truncated", "output flood; trial stopped"))
    observations += truncation_observations(out_trunc, err_trunc, limits.output_bytes)
    return SandboxResult(
        exit_status=ending.exit_status,
        timed_out=ending.timed_out,
        oom=ending.oom,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=out_trunc,
        stderr_truncated=err_trunc,
        wall_ms=ending.wall_ms,
        cpu_ms=ending.cpu_ms,
        backend=backend,
        isolation=isolation,
        limits_by=limits_by,
        observations=observations,
    )
