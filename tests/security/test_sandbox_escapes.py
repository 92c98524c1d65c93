"""An optimizer's harness attacking its own sandbox: what it can read of the host, how it
can load the host through the relay, and which isolation claims hold.

Each test runs against the real isolating backends (bwrap, docker) where they work here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from holedger.sandboxes.netns import MAX_RELAY_CONNECTIONS
from holedger.sandboxes.spec import Backend, Limits, SandboxResult

Runner = Callable[..., SandboxResult]

pytestmark = pytest.mark.slow

HOST_ONLY = "HOLEDGER_SECURITY_CANARY"


def test_host_environment_is_not_readable_through_proc(
    isolating: Backend, run_harness: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's environment (upstream API keys, paths) must not reach the harness, not
    even through another process's /proc/PID/environ (bwrap stays pid 1 inside)."""
    monkeypatch.setenv(HOST_ONLY, "sk-host-secret")
    result = run_harness(
        isolating,
        """
        import json, os
        found = {}
        for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self"]:
            for name in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as f:
                        found[f"{pid}/{name}"] = f.read().decode("latin-1")
                except OSError as exc:
                    found[f"{pid}/{name}"] = type(exc).__name__
        print(json.dumps(found))
        """,
    )
    assert result.exit_status == 0, result.stderr
    seen = json.loads(result.stdout)
    assert any(k.endswith("/environ") and "PATH=" in v for k, v in seen.items())
    leaked = {k: v for k, v in seen.items() if HOST_ONLY in v or "sk-host-secret" in v}
    assert not leaked, f"host environment visible inside the sandbox: {sorted(leaked)}"
    cwd = os.getcwd()
    assert not any(f"PWD={cwd}\0" in v for v in seen.values() if cwd != "/")


def test_only_its_own_sockets_are_visible(isolating: Backend, run_harness: Runner) -> None:
    """The network namespace is private: no host unix socket (abstract or not) and no host
    TCP listener is listed, and a host abstract socket cannot be reached."""
    name = f"holedger-sec-{os.getpid()}"
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    host.bind("\0" + name)
    host.listen(1)
    try:
        result = run_harness(
            isolating,
            f"""
            import json, socket
            out = {{}}
            with open("/proc/net/unix") as f:
                out["unix"] = f.read()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect("\\0{name}"); out["abstract"] = "connected"
            except OSError as exc:
                out["abstract"] = exc.errno
            print(json.dumps(out))
            """,
        )
    finally:
        host.close()
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["abstract"] != "connected"
    assert name not in out["unix"]
    assert "holedger" not in out["unix"]


class _CountingTarget:
    """A unix-socket server that holds every connection and counts the most at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o666)
        self.sock.listen(1024)
        self.open = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.open += 1
                self.peak = max(self.peak, self.open)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        conn.close()
        with self.lock:
            self.open -= 1

    def close(self) -> None:
        self.stop = True
        self.sock.close()


@pytest.fixture
def counting_target(tmp_path: Path) -> Iterator[_CountingTarget]:
    target = _CountingTarget(tmp_path / "target.sock")
    yield target
    target.close()


def test_relay_connections_are_capped_per_trial(
    isolating: Backend, run_harness: Runner, counting_target: _CountingTarget
) -> None:
    """Opening hundreds of connections to the relay must not open hundreds on the host:
    each would cost the host process sockets and threads, shared by every other trial."""
    attempts = MAX_RELAY_CONNECTIONS * 6
    result = run_harness(
        isolating,
        f"""
        import json, socket, time
        held, refused = [], 0
        for _ in range({attempts}):
            s = socket.socket()
            try:
                s.connect(("127.0.0.1", 18085)); held.append(s)
            except OSError:
                refused += 1
        time.sleep(1.5)
        print(json.dumps({{"held": len(held), "refused": refused}}))
        """,
        relays={18085: counting_target.path},
        limits=Limits(wall_s=30, pids=64),
    )
    assert result.exit_status == 0, result.stderr
    assert 0 < counting_target.peak <= MAX_RELAY_CONNECTIONS, counting_target.peak
    assert "network_attempt" in result.categories()


def test_docker_status_file_flood_stops_the_trial(
    docker_backend: Backend, run_harness: Runner
) -> None:
    """The entrypoint's status file is writable by the harness (same uid): filling it must
    be treated like an output flood, not read whole by the host until the timeout."""
    from holedger.sandboxes.docker_backend import OUT_DIR

    result = run_harness(
        docker_backend,
        f"""
        import time
        with open("{OUT_DIR}/status", "w") as f:
            for _ in range(40):
                f.write("9" * (1 << 20))
        time.sleep(60)
        """,
        limits=Limits(wall_s=20),
    )
    assert not result.timed_out
    assert result.exit_status is None
    assert any("flood" in o.detail for o in result.observations), result.observations


LEAVE_STATE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for path in ("/dev/shm/holedger-left", "/tmp/holedger-left", "/dev/mqueue/holedger-left"):
    try:
        with open(path, "w") as f:
            f.write("from the last trial")
        out[path] = "written"
    except OSError as exc:
        out[path] = exc.errno
out["sysv"] = libc.shmget(0x484C4447, 4096, 0o1666)  # IPC_CREAT | 0666
print(json.dumps(out))
"""

FIND_STATE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for path in ("/dev/shm/holedger-left", "/tmp/holedger-left", "/dev/mqueue/holedger-left"):
    out[path] = os.path.exists(path)
out["sysv"] = libc.shmget(0x484C4447, 0, 0) != -1
print(json.dumps(out))
"""


def test_nothing_a_trial_leaves_reaches_the_next(isolating: Backend, run_harness: Runner) -> None:
    """Shared memory, /tmp and SysV IPC are private to one trial: a harness cannot pass
    anything (a cache of answers, a signal) to a later trial of the same run."""
    first = run_harness(isolating, LEAVE_STATE)
    assert first.exit_status == 0, first.stderr
    assert "written" in json.loads(first.stdout).values()
    second = run_harness(isolating, FIND_STATE)
    assert second.exit_status == 0, second.stderr
    assert not any(json.loads(second.stdout).values()), second.stdout


def test_bwrap_exit_status_cannot_be_forged_through_proc(
    bwrap_backend: Backend, run_harness: Runner
) -> None:
    """The harness shares a uid with bwrap's init (pid 1) and the in-sandbox wrapper (pid 2)
    and can open what they hold through /proc/PID/fd. The exit-status channel must not be
    among it: a status the harness wrote itself would end its trial on its own terms."""
    result = run_harness(
        bwrap_backend,
        """
        import json, os, stat
        opened = []
        for pid in (1, 2):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                path = f"/proc/{pid}/fd/{fd}"
                try:
                    mode = os.stat(path).st_mode
                    if stat.S_ISREG(mode) or stat.S_ISCHR(mode):
                        continue  # the trial's own stdin and output files, /dev/null
                    w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(w, b"0\\n")
                    opened.append(os.readlink(path))
                except OSError:
                    pass
        print(json.dumps(opened))
        raise SystemExit(7)
        """,
    )
    assert json.loads(result.stdout) == []
    assert result.exit_status == 7
    assert "sandbox_error" not in result.categories()


def test_bwrap_harness_holds_only_stdio_and_cannot_write_the_root(
    bwrap_backend: Backend, run_harness: Runner
) -> None:
    """The harness starts with descriptors 0 to 2 only (nothing of holedger's plumbing), and
    the sandbox's root, a tmpfs without a size, is read-only: otherwise a harness under the
    rlimit fallback could fill host memory through it."""
    result = run_harness(
        bwrap_backend,
        """
        import json, os, sys
        fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
        out = {"fds": fds, "stdin": sys.stdin.read()}
        for path in ("/fill", "/opt/fill", "/run/holedger/fill"):
            try:
                open(path, "w").close()
                out[path] = "written"
            except OSError as exc:
                out[path] = exc.errno
        print(json.dumps(out))
        """,
        stdin=b"case-input",
    )
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["fds"][:3] == [0, 1, 2] and len(out["fds"]) == 4  # + the listing's own
    assert out["stdin"] == "case-input"
    assert all(out[p] == 30 for p in ("/fill", "/opt/fill", "/run/holedger/fill"))  # EROFS


def test_bwrap_dev_holds_the_usual_nodes_and_is_read_only(
    bwrap_backend: Backend, run_harness: Runner
) -> None:
    """/dev has the character devices programs expect (working), the stdio links, and
    /dev/shm; nothing else of the host's, and nothing can be created there: it lies on the
    read-only root rather than on a writable tmpfs without a size."""
    result = run_harness(
        bwrap_backend,
        """
        import json, os
        out = {"names": sorted(os.listdir("/dev"))}
        with open("/dev/null", "w") as f:
            f.write("x")
        out["zero"] = open("/dev/zero", "rb").read(4).hex()
        out["urandom"] = len(open("/dev/urandom", "rb").read(16))
        try:
            with open("/dev/full", "w") as f:
                f.write("x")
        except OSError as exc:
            out["full"] = exc.errno
        for path in ("/dev/fill", "/dev/mqueue"):
            try:
                os.mkdir(path) if path.endswith("mqueue") else open(path, "w").close()
                out[path] = "made"
            except OSError as exc:
                out[path] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    nodes = {"null", "zero", "full", "random", "urandom"}
    assert set(out["names"]) == nodes | {"fd", "stdin", "stdout", "stderr", "shm"}
    assert out["zero"] == "00000000" and out["urandom"] == 16
    assert out["full"] == 28  # ENOSPC: the real device
    assert out["/dev/fill"] == 30 and out["/dev/mqueue"] == 30  # EROFS


def test_shared_memory_is_size_limited(isolating: Backend, run_harness: Runner) -> None:
    """/dev/shm is writable (multiprocessing needs it) but bounded: without a size, a
    harness under the rlimit fallback could fill host memory through it."""
    result = run_harness(
        isolating,
        """
        import json, os
        st = os.statvfs("/dev/shm")
        with open("/dev/shm/probe", "w") as f:
            f.write("x")
        print(json.dumps({"bytes": st.f_blocks * st.f_frsize}))
        """,
    )
    assert result.exit_status == 0, result.stderr
    assert json.loads(result.stdout)["bytes"] <= 64 * 1024 * 1024


def test_cannot_leave_its_cgroup_or_mount_a_new_one(
    isolating: Backend, run_harness: Runner
) -> None:
    """The limits hold only while the harness stays in its cgroup: moving itself (or a
    child) elsewhere, or mounting a cgroup hierarchy of its own, must fail."""
    result = run_harness(
        isolating,
        """
        import ctypes, glob, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        moved = []
        for procs in glob.glob("/sys/fs/cgroup/**/cgroup.procs", recursive=True):
            try:
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
                moved.append(procs)
            except OSError:
                pass
        os.makedirs("/tmp/cg", exist_ok=True)
        mounted = libc.mount(b"cgroup", b"/tmp/cg", b"cgroup", 0, b"memory") == 0
        print(json.dumps({"moved": moved, "mounted": mounted}))
        """,
    )
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {"moved": [], "mounted": False}


def test_ipv6_and_raw_sockets_reach_nothing(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        import json, socket
        out = {}
        for name, addr in (("v6-out", ("2606:4700:4700::1111", 443)), ("v6-lo", ("::1", 443))):
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s.settimeout(3)
            try:
                s.connect(addr); out[name] = "connected"
            except OSError as exc:
                out[name] = exc.errno
        for name, args in (
            ("raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
            ("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0)),
        ):
            try:
                socket.socket(*args); out[name] = "opened"
            except OSError as exc:
                out[name] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    assert "connected" not in out.values() and "opened" not in out.values(), out
