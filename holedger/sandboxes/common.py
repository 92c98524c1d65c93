"""Pieces every backend shares: the environment, output files, process scans, /etc files."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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
    }
    env.update(spec.env)
    return env


def etc_dir() -> Path:
    """A cached directory holding the synthetic /etc files a sandbox sees."""
    root = cache_root() / "sandbox-etc-1"
    if all((root / name).is_file() for name in ETC_FILES):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".etc-", dir=root.parent))
    for name, text in ETC_FILES.items():
        (work / name).write_text(text)
        os.chmod(work / name, 0o644)
    os.chmod(work, 0o755)
    try:
        os.rename(work, root)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
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


def proc_status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
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
    io: TrialIO,
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
    stdout, out_trunc = io.collect(io.stdout_path)
    stderr, err_trunc = io.collect(io.stderr_path)
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
