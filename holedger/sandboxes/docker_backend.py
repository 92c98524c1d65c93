"""The docker backend: one container per trial, on a local Docker engine.

The container: the holedger sandbox image (``holedger sandbox build-image``), network
``none``, read-only root, a size-limited tmpfs /tmp, all capabilities dropped,
no-new-privileges, user 65534, memory (swap included), CPU, pids and CPU-time limits,
labels ``holedger.sandbox=1``, ``holedger.trial=<label>`` and ``holedger.deadline=<epoch>``.
The candidate is bind-mounted read-only at /code.

Relays and the network recorder are the same host-side services as for bwrap: once the
container runs, holedger (root) enters its network namespace, binds them, and only then
creates IN_DIR/ready, which the entrypoint (``entry.py``, pid 1) waits for before it runs
the harness. The entrypoint reports the harness's exit status in OUT_DIR/status; holedger
then lists what else still runs in the container (``process_left_behind``), and kills and
force-removes it. At the timeout the container is killed and removed; leftovers of a
crashed holedger are removed by label once their deadline has passed.

Docker's engine address: ``DOCKER_HOST`` when set, else ``unix:///run/holedger-docker.sock``
when that socket exists (what ``.ci/docker-up.sh`` starts), else docker's default.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from holedger.errors import SandboxError
from holedger.sandboxes.cgroups import TrialCgroup
from holedger.sandboxes.common import (
    Ending,
    TrialIO,
    leftover_observation,
    pidns_members,
    pidns_of,
    sandbox_env,
    trial_result,
)
from holedger.sandboxes.docker_client import docker_client, docker_host
from holedger.sandboxes.docker_io import ENTRY_SHELL, FifoStreams, seccomp_profile
from holedger.sandboxes.image import ENTRY_PATH, IMAGE, IN_DIR, OUT_DIR, image_key
from holedger.sandboxes.netns import NetnsServices
from holedger.sandboxes.runtime import runtime_distributions, runtime_key
from holedger.sandboxes.spec import (
    BIN_DIR,
    CODE_DIR,
    SANDBOX_GID,
    SANDBOX_UID,
    Observation,
    SandboxResult,
    SandboxSpec,
)

LABEL = "holedger.sandbox"
GC_GRACE_S = 60
POLL_S = 0.005
STATE_EVERY_S = 0.25


def _cgroup_of(pid: int, limits: Any) -> TrialCgroup | None:
    """The container's own cgroup(s), read from its init's /proc/PID/cgroup."""
    dirs: dict[str, Path] = {}
    version = 1
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(","):
            if ctrl in ("memory", "cpuacct", "pids", "freezer", "cpu"):
                d = Path("/sys/fs/cgroup") / ctrl / path.lstrip("/")
                if d.is_dir():
                    dirs[ctrl] = d
    if not {"memory", "cpuacct", "pids", "freezer"} <= dirs.keys():
        unified = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        d = Path("/sys/fs/cgroup") / (unified or "").lstrip("/")
        if unified is None or not (d / "memory.events").exists():
            return None
        version, dirs = 2, {"unified": d}
    return TrialCgroup(version, dirs, limits)


def _world_readable(root: Path) -> bool:
    for dirpath, _dirnames, filenames in os.walk(root):
        if os.stat(dirpath).st_mode & 0o005 != 0o005:
            return False
        for name in filenames:
            with contextlib.suppress(OSError):
                if os.stat(os.path.join(dirpath, name)).st_mode & 0o004 == 0:
                    return False
    return True


class _Remover:
    """Removes dead trial containers in the background; drained when the interpreter exits.

    Whatever is still queued when holedger dies is found later by ``collect_garbage``.
    """

    def __init__(self, remove: Callable[[str], object]) -> None:
        self._remove = remove
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, container_id: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, daemon=True)
                self._thread.start()
                atexit.register(self.drain)
        self._queue.put(container_id)

    def _work(self) -> None:
        while True:
            cid = self._queue.get()
            with contextlib.suppress(Exception):
                self._remove(cid)
            self._queue.task_done()

    def drain(self, timeout_s: float = 30.0) -> None:
        end = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)


class DockerBackend:
    """Trials in Docker containers."""

    name = "docker"

    def __init__(self, image: str = IMAGE, client: Any = None) -> None:
        self.image = image
        self._client = client
        self._available: tuple[bool, str] | None = None
        self._gc_done = False
        self._remover = _Remover(lambda cid: self.client.api.remove_container(cid, force=True))

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_client()
        return self._client

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until the containers of finished trials are removed."""
        self._remover.drain(timeout_s)

    def close(self) -> None:
        """Nothing is made ahead of a trial; finished trials' containers are removed."""
        self.settle()

    def available(self) -> tuple[bool, str]:
        if self._available is None:
            self._available = self._probe()
        return self._available

    def _probe(self) -> tuple[bool, str]:
        try:
            client = docker_client(timeout=5)
            client.ping()
            version = client.version().get("Version", "?")
        except SandboxError as exc:
            return False, exc.message
        except Exception as exc:
            return False, f"no Docker engine at {docker_host() or 'the default socket'}: {exc}"
        if os.geteuid() != 0:
            return False, "needs root: holedger enters each container's network namespace"
        try:
            image = client.images.get(self.image)
        except Exception:
            return False, f"image {self.image} missing (run: holedger sandbox build-image)"
        self._client = client
        labels = (image.attrs.get("Config") or {}).get("Labels") or {}
        expected = image_key(runtime_key(runtime_distributions()))
        if labels.get("holedger.image") != expected:
            return False, f"image {self.image} is stale (run: holedger sandbox build-image)"
        return True, f"docker {version} at {docker_host() or 'default'}; image {expected}"

    # ------------------------------------------------------------------ leftovers

    def collect_garbage(self, force: bool = False) -> list[str]:
        """Remove holedger trial containers whose deadline has passed (or all, with force)."""
        removed = []
        now = time.time()
        for c in self.client.containers.list(all=True, filters={"label": LABEL}):
            deadline = float(c.labels.get("holedger.deadline", "0") or 0)
            if force or deadline + GC_GRACE_S < now:
                with contextlib.suppress(Exception):
                    c.remove(force=True)
                    removed.append(c.id)
        return removed

    # ------------------------------------------------------------------ run

    def container_kwargs(
        self, spec: SandboxSpec, code: Path, io_in: Path, io_out: Path
    ) -> dict[str, Any]:
        """Arguments for ``containers.run`` (no side effects; unit-testable)."""
        lim = spec.limits
        mem = lim.memory_mb * 1024 * 1024
        volumes = {
            str(code): {"bind": CODE_DIR, "mode": "ro"},
            str(io_in): {"bind": IN_DIR, "mode": "ro"},
            str(io_out): {"bind": OUT_DIR, "mode": "rw"},
        }
        for p in spec.extra_ro_binds:
            rp = str(Path(p).resolve())
            volumes[rp] = {"bind": rp, "mode": "ro"}
        import docker.types

        cpu_s = max(1, int(lim.cpu_time_s + 0.999))
        security = ["no-new-privileges"]
        profile = seccomp_profile()
        if profile is not None:
            security.append(f"seccomp={profile}")
        return {
            "image": self.image,
            "command": [
                "/bin/sh",
                "-c",
                ENTRY_SHELL,
                f"{OUT_DIR}/entry",
                f"{BIN_DIR}/python3",
                "-I",
                "-S",
                ENTRY_PATH,
                IN_DIR,
                OUT_DIR,
                "--",
                *spec.argv,
            ],
            "detach": True,
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/tmp": f"size={lim.tmp_mb}m,mode=1777"},
            "mem_limit": mem,
            "memswap_limit": mem,
            "nano_cpus": int(lim.cpus * 1e9),
            "pids_limit": lim.pids,
            "ulimits": [
                docker.types.Ulimit(name="cpu", soft=cpu_s, hard=cpu_s + 1),
                docker.types.Ulimit(name="core", soft=0, hard=0),
            ],
            "user": f"{SANDBOX_UID}:{SANDBOX_GID}",
            "cap_drop": ["ALL"],
            "security_opt": security,
            # No log file on the host: the container's own stdout and stderr carry nothing
            # (the entrypoint's are a tripwire pipe, see docker_io).
            "log_config": {"type": "none", "config": {}},
            "environment": sandbox_env(spec),
            "working_dir": CODE_DIR,
            "volumes": volumes,
            "labels": {
                LABEL: "1",
                "holedger.trial": spec.label or "trial",
                "holedger.deadline": str(int(time.time() + lim.wall_s + 30)),
            },
            "hostname": "sandbox",
        }

    def run(self, spec: SandboxSpec) -> SandboxResult:
        ok, why = self.available()
        if not ok:
            raise SandboxError(f"the docker backend is unavailable: {why}")
        if not Path(spec.code_dir).is_dir():
            raise SandboxError(f"code directory {spec.code_dir} does not exist")
        if not self._gc_done:
            self.collect_garbage()
            self._gc_done = True
        lim = spec.limits
        io = TrialIO(lim)
        io_in, io_out = io.dir / "in", io.dir / "out"
        io_in.mkdir()
        io_out.mkdir()
        (io_in / "stdin").write_bytes(spec.stdin)
        for d in (io.dir, io_in, io_out):
            os.chmod(d, 0o755)
        streams = FifoStreams(io_out, lim.output_bytes)
        code = Path(spec.code_dir).resolve()
        if not _world_readable(code):
            staged = Path(tempfile.mkdtemp(prefix="code-", dir=io.dir))
            shutil.copytree(code, staged, dirs_exist_ok=True, symlinks=True)
            for dirpath, _, filenames in os.walk(staged):
                os.chmod(dirpath, 0o755)
                for n in filenames:
                    p = os.path.join(dirpath, n)
                    if not os.path.islink(p):
                        mode = os.stat(p).st_mode
                        os.chmod(p, 0o755 if mode & stat.S_IXUSR else 0o644)
            code = staged
        services = NetnsServices(spec.relays, record=True)
        observations: list[Observation] = []
        container: str | None = None
        cg: TrialCgroup | None = None
        start = time.monotonic()
        try:
            container = self._start(self.container_kwargs(spec, code, io_in, io_out))
            state = self.client.api.inspect_container(container)["State"]
            init_pid = int(state.get("Pid") or 0)
            if init_pid <= 0:
                raise SandboxError("the container exited before it could be set up")
            cg = _cgroup_of(init_pid, lim)
            ns = pidns_of(init_pid)
            services.setup_enter(init_pid)
            (io_in / "ready").touch()
            status, timed_out, flooded = self._wait(container, streams, start + lim.wall_s)
            if streams.host_writes():
                observations.append(
                    Observation(
                        "host_write",
                        f"{streams.host_writes()} bytes written to the entrypoint's own "
                        "stdout/stderr (/proc/1/fd/1 or 2), the container's log pipe; "
                        "kept nowhere, trial stopped",
                    )
                )
            exit_status: int | None = None
            if status is not None:
                exit_status = status
                if ns is not None:
                    left = [m for m in pidns_members(ns, cg.pids() if cg else None) if m[1] > 1]
                    if left:
                        observations.append(leftover_observation(left))
            elif not timed_out and not flooded:
                state = self.client.api.inspect_container(container)["State"]
                exit_status = state.get("ExitCode")
                observations.append(
                    Observation("sandbox_error", "the container ended before the harness reported")
                )
            oom = bool(cg and cg.oom_killed())
            pids_hit = bool(cg and cg.pids_limit_hit())
            cpu_ms = cg.cpu_ms() if cg else None
            if cg is not None:
                cg.kill_all()
            else:
                with contextlib.suppress(Exception):
                    state = self.client.api.inspect_container(container)["State"]
                    oom = bool(state.get("OOMKilled"))
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(f"docker trial failed: {exc}") from exc
        finally:
            streams.pump()
            streams.close()
            observations[:0] = services.close()
            if container is not None:
                if cg is not None and not cg.pids():
                    self._remover.submit(container)  # already dead: remove off the clock
                else:
                    with contextlib.suppress(Exception):
                        self.client.api.remove_container(container, force=True)
        wall_ms = int((time.monotonic() - start) * 1000)
        ending = Ending(
            exit_status=None if timed_out or flooded else exit_status,
            timed_out=timed_out,
            oom=oom,
            pids_hit=pids_hit,
            flooded=flooded and not streams.host_writes(),  # that one says so itself
            wall_ms=wall_ms,
            cpu_ms=cpu_ms,
        )
        try:
            return trial_result(
                streams,
                lim,
                ending,
                observations,
                backend="docker",
                isolation="isolated",
                limits_by="docker",
            )
        finally:
            io.cleanup()

    def _start(self, kwargs: dict[str, Any]) -> str:
        """Create and start the container with the low-level API (fewer round trips)."""
        from docker.models.containers import _create_container_args

        kwargs = dict(kwargs)
        kwargs.pop("detach", None)
        kwargs["version"] = self.client.api._version
        created = self.client.api.create_container(**_create_container_args(kwargs))
        container_id: str = created["Id"]
        try:
            self.client.api.start(container_id)
        except Exception:
            with contextlib.suppress(Exception):
                self.client.api.remove_container(container_id, force=True)
            raise
        return container_id

    def _wait(
        self, container: str, streams: FifoStreams, deadline: float
    ) -> tuple[int | None, bool, bool]:
        """(exit status or None, timed out, output flood); a write to the entrypoint's own
        stdout or stderr stops the trial like a flood."""
        next_state = time.monotonic() + STATE_EVERY_S
        while True:
            streams.pump()
            if streams.status_flooded() or streams.flooded() or streams.host_writes():
                return None, False, True
            status = streams.status()
            if status is not None:
                streams.pump()  # what the harness wrote before it exited
                return status, False, False
            now = time.monotonic()
            if now > deadline:
                return None, True, False
            if now > next_state:
                next_state = now + STATE_EVERY_S
                state = self.client.api.inspect_container(container)["State"]
                if state.get("Status") != "running":
                    streams.pump()
                    if streams.status_flooded():
                        return None, False, True
                    return streams.status(), False, False
            time.sleep(POLL_S)
