"""Per-trial control groups: memory, CPU share, process count, and a whole-tree kill.

cgroup v2 is used when the unified hierarchy has the memory, pids and cpu controllers and
a child can be made under our own group; otherwise cgroup v1 (memory, cpu, cpuacct, pids,
freezer) when those hierarchies are writable. When neither is possible the caller falls
back to rlimits and says so in ``SandboxResult.limits_by``.

A trial's group is a child of the group holedger itself runs in, named
``holedger-<label>-<random>``, and is removed after the trial.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from holedger.sandboxes.spec import Limits

V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "freezer")
CFS_PERIOD_US = 100_000
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _own_groups() -> dict[str, str]:
    """controller -> own path, from /proc/self/cgroup ("" is the v2 entry)."""
    groups: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(",") if ctrls else [""]:
            groups[ctrl] = path
    return groups


def _mounts() -> tuple[dict[str, Path], Path | None]:
    """v1 controller -> mount point, and the cgroup2 mount point."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup2" and v2 is None:
            v2 = Path(parts[1])
        elif parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in V1_CONTROLLERS and opt not in v1:
                    v1[opt] = Path(parts[1])
    return v1, v2


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    return out


@dataclass
class TrialCgroup:
    """One trial's group (v1: one directory per controller; v2: one directory)."""

    version: int
    dirs: dict[str, Path]  # controller -> directory ("unified" for v2)
    limits: Limits
    pids_max_hits: int = 0
    _removed: bool = field(default=False, repr=False)

    @property
    def mode(self) -> str:
        return f"cgroup-v{self.version}"

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    @property
    def join_files(self) -> list[Path]:
        """Where a process writes "0" to move itself into the group.

        v1: each ``tasks`` file. Moving the writing thread itself (a single-threaded
        process, then) skips the global lock that moving a given pid takes, which waits for
        an RCU grace period: well under 1 ms against often 10 ms or more.
        v2: ``cgroup.procs``."""
        name = "cgroup.procs" if self.version == 2 else "tasks"
        return [d / name for d in self.dirs.values()]

    @contextlib.contextmanager
    def thread_joined(self) -> Iterator[None]:
        """v1: the calling thread itself inside the group for the moment, so that a process
        it spawns starts there (a child starts in its forking thread's groups). Moving only
        itself takes no global lock (see ``join_files``); on the way out the thread goes
        back to the groups the trial's group was made under, holedger's own."""
        if self.version != 1:
            raise ValueError("only a cgroup v1 group takes a single thread")
        moved: list[Path] = []
        try:
            for d in self.dirs.values():
                _write(d / "tasks", "0")
                moved.append(d)
            yield
        finally:
            # Every move back is tried: a thread left in the group would be frozen with it.
            # The parents cannot go away (holedger's other threads live in them).
            failed: list[OSError] = []
            for d in moved:
                try:
                    _write(d.parent / "tasks", "0")
                except OSError as exc:
                    failed.append(exc)
            if failed:
                raise failed[0]

    def members(self) -> list[int]:
        """The group's processes, from one controller: every process of a trial joins all
        of them together and cannot leave, so one listing is enough to look."""
        first = next(iter(self.dirs.values())) / "cgroup.procs"
        try:
            fd = os.open(first, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except OSError:
            return []
        finally:
            os.close(fd)
        own = os.getpid()  # only ever for a moment, while a thread spawns (thread_joined)
        return [pid for pid in map(int, b"".join(chunks).split()) if pid != own]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in f.read_text().split())
        found.discard(os.getpid())  # never holedger itself (see members)
        return sorted(found)

    def oom_killed(self) -> bool:
        if self.version == 2:
            return _keyed(self.dirs["unified"] / "memory.events").get("oom_kill", 0) > 0
        ctl = _keyed(self.dirs["memory"] / "memory.oom_control")
        if "oom_kill" in ctl:
            return ctl["oom_kill"] > 0
        return (_read_int(self.dirs["memory"] / "memory.failcnt") or 0) > 0

    def pids_limit_hit(self) -> bool:
        d = self.dirs["unified" if self.version == 2 else "pids"]
        return _keyed(d / "pids.events").get("max", 0) > 0

    def cpu_ms(self) -> int | None:
        if self.version == 2:
            usec = _keyed(self.dirs["unified"] / "cpu.stat").get("usage_usec")
            return None if usec is None else usec // 1000
        ns = _read_int(self.dirs["cpuacct"] / "cpuacct.usage")
        return None if ns is None else ns // 1_000_000

    def kill_all(self, deadline_s: float = 5.0) -> list[int]:
        """Freeze, SIGKILL every member, thaw; repeat until empty. Returns what was killed."""
        killed: set[int] = set()
        if not self.members():
            return []
        end = time.monotonic() + deadline_s
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > end:
                return sorted(killed)
            self._freeze(True)
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            self._freeze(False)
            time.sleep(0.005)

    def _freeze(self, on: bool) -> None:
        with contextlib.suppress(OSError):
            if self.version == 2:
                _write(self.dirs["unified"] / "cgroup.freeze", "1" if on else "0")
            else:
                _write(self.dirs["freezer"] / "freezer.state", "FROZEN" if on else "THAWED")
                if on:
                    state = self.dirs["freezer"] / "freezer.state"
                    for _ in range(200):
                        if state.read_text().strip() != "FREEZING":
                            break
                        time.sleep(0.001)

    def remove(self) -> None:
        if self._removed:
            return
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
        self._removed = True


class CgroupManager:
    """Finds a usable cgroup hierarchy once and makes per-trial groups in it."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.reason = ""
        self._parents: dict[str, Path] = {}
        try:
            self._detect()
        except OSError as exc:  # no /proc, no cgroupfs
            self.version, self.reason = None, f"cgroups unreadable: {exc}"

    def _detect(self) -> None:
        own = _own_groups()
        v1, v2 = _mounts()
        if v2 is not None:
            parent = v2 / own.get("", "/").lstrip("/")
            if self._v2_delegates(parent):
                self.version, self._parents = 2, {"unified": parent}
                self.reason = f"cgroup v2 at {v2}"
                return
        missing = [c for c in V1_CONTROLLERS if c not in v1]
        if missing:
            self.reason = f"no cgroup v2 with memory+pids+cpu and v1 lacks {', '.join(missing)}"
            return
        parents = {c: v1[c] / own.get(c, "/").lstrip("/") for c in V1_CONTROLLERS}
        unwritable = [c for c, p in parents.items() if not os.access(p, os.W_OK)]
        if unwritable:
            self.reason = f"cgroup v1 not writable for {', '.join(unwritable)}"
            return
        self.version, self._parents = 1, parents
        self.reason = "cgroup v1 (memory, cpu, cpuacct, pids, freezer)"

    @staticmethod
    def _v2_delegates(parent: Path) -> bool:
        """Does ``parent`` hand memory, pids and cpu to its children (or can it be made to)?"""
        wanted = {"memory", "pids", "cpu"}
        try:
            if not wanted <= set((parent / "cgroup.controllers").read_text().split()):
                return False
            subtree = parent / "cgroup.subtree_control"
            if wanted <= set(subtree.read_text().split()):
                return True
            _write(subtree, " ".join(f"+{c}" for c in sorted(wanted)))
            return wanted <= set(subtree.read_text().split())
        except OSError:
            return False

    def collect_garbage(self) -> list[str]:
        """Remove empty per-trial groups a crashed holedger left behind; returns their names."""
        removed: set[str] = set()
        for parent in self._parents.values():
            for d in parent.glob("holedger-*"):
                try:
                    if (d / "cgroup.procs").read_text().strip():
                        continue
                    d.rmdir()
                    removed.add(d.name)
                except OSError:
                    continue
        return sorted(removed)

    @property
    def usable(self) -> bool:
        return self.version is not None

    def create(self, label: str, limits: Limits | None) -> TrialCgroup | None:
        """A new group with ``limits`` applied (None: none yet, see ``apply``), or None when
        cgroups are not usable."""
        if self.version is None:
            return None
        name = f"holedger-{_SAFE.sub('_', label)[:40]}-{secrets.token_hex(4)}"
        dirs = {c: p / name for c, p in self._parents.items()}
        made: list[Path] = []
        try:
            for d in dirs.values():
                d.mkdir()
                made.append(d)
            group = TrialCgroup(self.version, dirs, limits or Limits())
            if limits is not None:
                self.apply(group, limits)
            return group
        except OSError as exc:
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
            self.version, self.reason = None, f"cannot create a cgroup: {exc}"
            return None

    def apply(self, group: TrialCgroup, limits: Limits) -> None:
        """Set ``limits`` on ``group`` (once; a group made without limits takes them later)."""
        group.limits = limits
        mem = limits.memory_mb * 1024 * 1024
        quota = max(1000, int(limits.cpus * CFS_PERIOD_US))
        if group.version == 2:
            d = group.dirs["unified"]
            _write(d / "memory.max", str(mem))
            with contextlib.suppress(OSError):
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(limits.pids))
            _write(d / "cpu.max", f"{quota} {CFS_PERIOD_US}")
            return
        _write(group.dirs["memory"] / "memory.limit_in_bytes", str(mem))
        memsw = group.dirs["memory"] / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            with contextlib.suppress(OSError):
                _write(memsw, str(mem))
        _write(group.dirs["pids"] / "pids.max", str(limits.pids))
        _write(group.dirs["cpu"] / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(group.dirs["cpu"] / "cpu.cfs_quota_us", str(quota))


_MANAGER: CgroupManager | None = None


def manager() -> CgroupManager:
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = CgroupManager()
    return _MANAGER
