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
