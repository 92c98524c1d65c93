"""The sandbox contract: what a trial asks for (SandboxSpec) and what it gets back (SandboxResult).

Every backend (bwrap, docker, process) takes the same spec and returns the same result, so
the server records one shape of TrialCompleted whatever ran the trial. A backend says how
strong its isolation is (``isolation``) and what enforced the limits (``limits_by``); the
server records both, so a reader of the ledger never has to guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from holedger.untrusted import escape_text

# Where things appear inside every isolated backend; the same paths in bwrap and docker.
CODE_DIR = "/code"
RUNTIME_DIR = "/opt/holedger/runtime"
BIN_DIR = "/opt/holedger/bin"
SANDBOX_PATH = f"{BIN_DIR}:/usr/local/bin:/usr/bin:/bin"
SANDBOX_UID = 65534
SANDBOX_GID = 65534


@dataclass(frozen=True)
class Limits:
    """Resource limits of one trial."""

    wall_s: float = 60.0
    memory_mb: int = 512
    cpu_s: float | None = None  # CPU-time limit; None means wall_s
    cpus: float = 1.0  # CPU share (1.0 = one core)
    pids: int = 64
    output_bytes: int = 1 << 20  # cap for stdout and for stderr, each
    tmp_mb: int = 64  # size of the private writable /tmp

    @property
    def cpu_time_s(self) -> float:
        return self.cpu_s if self.cpu_s is not None else self.wall_s

    def as_record(self) -> dict[str, int]:
        """Integer view for TrialCompleted.limits (milliseconds, MiB, milli-CPUs)."""
        return {
            "wall_ms": int(self.wall_s * 1000),
            "memory_mb": self.memory_mb,
            "cpu_ms": int(self.cpu_time_s * 1000),
            "millicpus": int(self.cpus * 1000),
            "pids": self.pids,
            "output_bytes": self.output_bytes,
            "tmp_mb": self.tmp_mb,
        }


@dataclass(frozen=True)
class SandboxSpec:
    """One trial: the candidate tree, its entrypoint, one case on stdin, and the limits."""

    code_dir: Path  # the candidate tree, read-only, mounted as /code (also the cwd)
    argv: list[str]  # entrypoint, e.g. ["python3", "-m", "harness"]
    stdin: bytes = b""  # one case as JSON
    env: dict[str, str] = field(default_factory=dict)  # the only environment (plus basics)
    relays: dict[int, Path] = field(default_factory=dict)  # 127.0.0.1:PORT -> host unix socket
    limits: Limits = field(default_factory=Limits)
    label: str = ""  # e.g. the trial id; container labels and cgroup names
    extra_ro_binds: tuple[Path, ...] = ()  # extra read-only host paths, at the same path


@dataclass(frozen=True)
class Observation:
    """An attempt the sandbox saw; upstream it becomes a SafetyViolation event.

    ``category`` is one of ``holedger.schemas.events.SAFETY_CATEGORIES``.
    """

    category: str
    detail: str

    def __post_init__(self) -> None:
        # The detail may quote what a harness chose (a DNS name, a path): stored escaped.
        object.__setattr__(self, "detail", escape_text(self.detail))


Isolation = Literal["isolated", "none"]


@dataclass
class SandboxResult:
    """What came out of one trial."""

    exit_status: int | None  # exit code; 128+N when killed by signal N; None if never known
    timed_out: bool
    oom: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    wall_ms: int
    cpu_ms: int | None
    backend: str  # "bwrap" | "docker" | "process"
    isolation: Isolation
    limits_by: str  # "cgroup-v1" | "cgroup-v2" | "rlimit" | "docker"
    observations: list[Observation] = field(default_factory=list)
    node: str | None = None  # the id of the machine that ran it, when not the server's

    def categories(self) -> list[str]:
        return [o.category for o in self.observations]


@runtime_checkable
class Backend(Protocol):
    """A way to run one trial in isolation (or, for ``process``, without)."""

    name: str

    def available(self) -> tuple[bool, str]:
        """(works here, why or why not)."""
        ...

    def run(self, spec: SandboxSpec) -> SandboxResult:
        """Run the trial to completion; never raises for anything the candidate did."""
        ...

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until the clean-up of finished trials, done off their clock, is over."""
        ...

    def close(self) -> None:
        """Clean up: release what set-up made ahead for later trials, after settling."""
        ...
