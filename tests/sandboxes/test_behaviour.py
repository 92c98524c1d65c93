"""A well-behaved harness: the same answer under every backend, and the gateway relay."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from descriptors import holding_descriptors

from holedger.sandboxes.spec import Backend, Limits, SandboxResult, SandboxSpec

Runner = Callable[..., SandboxResult]

WELL_BEHAVED = """
import json, sys
case = json.load(sys.stdin)
print(json.dumps({"answer": sum(case["numbers"]), "cwd": __import__("os").getcwd()}))
"""


def test_well_behaved_harness_gives_the_same_answer_everywhere(
    every_backend: Backend, run_harness: Runner
) -> None:
    result = run_harness(every_backend, WELL_BEHAVED, stdin=b'{"numbers": [1, 2, 39]}')
    assert result.exit_status == 0, result.stderr
    assert json.loads(result.stdout)["answer"] == 42
    assert result.backend == every_backend.name
    assert not result.timed_out and not result.oom
    if every_backend.name == "process":
        assert result.isolation == "none"
        assert "unisolated_trial" in result.categories()
    else:
        assert result.isolation == "isolated"
        assert json.loads(result.stdout)["cwd"] == "/code"
        assert result.categories() == []
    assert result.limits_by in ("cgroup-v1", "cgroup-v2", "rlimit", "docker")


class _GatewayHandler(BaseHTTPRequestHandler):
    def _send(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(
            {
                "object": "list",
                "data": [{"id": "sim-1", "object": "model", "created": 0, "owned_by": "t"}],
                "auth": self.headers.get("authorization", ""),
            }
        )

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length))
        self._send(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "relayed"},
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    def log_message(self, format: str, *args: object) -> None:
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def gateway_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "gw.sock"
    server = _UnixHTTPServer(str(path), _GatewayHandler)
    path.chmod(0o666)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


def test_harness_reaches_gateway_through_the_relay(
    isolating: Backend, run_harness: Runner, gateway_socket: Path
) -> None:
    result = run_harness(
        isolating,
        """
        import os, openai
        client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], max_retries=0)
        reply = client.chat.completions.create(
            model="sim-1", messages=[{"role": "user", "content": "hi"}])
        print(reply.choices[0].message.content)
        """,
        env={"OPENAI_BASE_URL": "http://127.0.0.1:18080/v1", "OPENAI_API_KEY": "trial-token"},
        relays={18080: gateway_socket},
        limits=Limits(wall_s=60),
    )
    assert result.exit_status == 0, result.stderr
    assert result.stdout.strip() == b"relayed"
    assert not [o for o in result.observations if o.category == "network_attempt"]


def test_relay_carries_plain_http_and_auth(
    isolating: Backend, run_harness: Runner, gateway_socket: Path
) -> None:
    result = run_harness(
        isolating,
        """
        import urllib.request
        req = urllib.request.Request("http://127.0.0.1:18081/v1/models",
                                     headers={"Authorization": "Bearer t-1"})
        print(urllib.request.urlopen(req, timeout=10).read().decode())
        """,
        relays={18081: gateway_socket},
    )
    assert result.exit_status == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["data"][0]["id"] == "sim-1"
    assert body["auth"] == "Bearer t-1"


def test_process_backend_says_unisolated_and_still_kills_its_tree(
    process_backend: Backend, run_harness: Runner
) -> None:
    result = run_harness(
        process_backend,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        time.sleep(600)
        """,
        limits=Limits(wall_s=1.5),
    )
    assert result.isolation == "none"
    assert result.timed_out
    assert {"unisolated_trial", "timeout"} <= set(result.categories())


@pytest.fixture
def without_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend no cgroup hierarchy is usable, as on a machine where holedger is not root."""
    from holedger.sandboxes import cgroups

    manager = cgroups.CgroupManager()
    manager.version, manager.reason = None, "disabled by the test"
    monkeypatch.setattr(cgroups, "_MANAGER", manager)


def test_bwrap_without_cgroups_falls_back_to_rlimits(
    without_cgroups: None, bwrap_backend: Backend, run_harness: Runner
) -> None:
    backend = bwrap_backend
    hog = run_harness(
        backend,
        """
        try:
            x = bytearray(1024 * 1024 * 1024)
            print("allocated")
        except MemoryError:
            print("MemoryError")
        """,
        limits=Limits(wall_s=30, memory_mb=256),
    )
    assert hog.limits_by == "rlimit"
    assert hog.stdout.strip() == b"MemoryError"
    sleeper = run_harness(
        backend,
        """
        import os, time
        if os.fork() == 0:
            os.setsid(); time.sleep(600)
        time.sleep(600)
        """,
        limits=Limits(wall_s=1.5),
    )
    assert sleeper.timed_out and sleeper.limits_by == "rlimit"


def test_concurrent_trials_keep_their_own_observations(isolating: Backend, code_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> SandboxResult:
        spec = SandboxSpec(
            code_dir=code_dir,
            argv=["python3", "-c", PROBE_ONE.format(i=i)],
            limits=Limits(wall_s=30),
            label=f"concurrent-{i}",
        )
        return isolating.run(spec)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, range(3)))
    for i, result in enumerate(results):
        assert result.stdout == f"{i}\n".encode(), result.stderr
        details = [o.detail for o in result.observations]
        assert details == [f"tcp connect to 10.0.0.{i}:80"]


PROBE_ONE = """
import socket
s = socket.socket(); s.settimeout(5)
try:
    s.connect(("10.0.0.{i}", 80))
except OSError:
    pass
print({i})
"""


def test_candidate_cannot_take_over_the_relay(
    isolating: Backend, run_harness: Runner, gateway_socket: Path
) -> None:
    """The relay listens before the harness starts and lives outside the sandbox: the
    harness can neither bind its port nor stop it from serving."""
    result = run_harness(
        isolating,
        """
        import json, os, signal, socket, urllib.request
        out = {}
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", 18082)); out["bind"] = "bound"
        except OSError as exc:
            out["bind"] = exc.errno
        out["visible"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        try:
            os.kill(1, signal.SIGKILL)  # the namespace's init ignores this from inside
        except OSError:
            pass
        body = urllib.request.urlopen("http://127.0.0.1:18082/v1/models", timeout=10).read()
        out["models"] = json.loads(body)["data"][0]["id"]
        print(json.dumps(out))
        """,
        relays={18082: gateway_socket},
    )
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["bind"] == 98  # EADDRINUSE: the relay already holds the port
    assert out["models"] == "sim-1"  # and still serves after the attempt on init
    assert max(out["visible"]) < 10  # only the trial's own pid namespace is visible


def test_process_backend_relays_on_host_loopback(
    process_backend: Backend, run_harness: Runner, gateway_socket: Path
) -> None:
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    result = run_harness(
        process_backend,
        f"""
        import urllib.request
        url = "http://127.0.0.1:{port}/v1/models"
        print(urllib.request.urlopen(url, timeout=10).read().decode())
        """,
        relays={port: gateway_socket},
    )
    assert result.exit_status == 0, result.stderr
    assert json.loads(result.stdout)["data"][0]["id"] == "sim-1"


def test_namespace_made_ahead_hands_a_recorded_port_to_the_relay(gateway_socket: Path) -> None:
    """bwrap trials take a network namespace made ahead of them, with the recorder already
    listening on every recorded port. A relay on one of those ports (18080 is one) must take
    the port over, and every other port must still be recorded."""
    import os
    import socket
    import time
    import urllib.request

    from holedger.sandboxes.netns import RECORDED_TCP_PORTS, NetnsServices

    if os.geteuid() != 0:
        pytest.skip("making a network namespace needs root")
    assert 18080 in RECORDED_TCP_PORTS
    services = NetnsServices({}, record=True)
    services.prepare()
    try:
        services.relays = {18080: gateway_socket}
        with services.entered():
            services.bind()
        services.start()
        with services.entered():  # this thread, as a harness would be
            body = urllib.request.urlopen("http://127.0.0.1:18080/v1/models", timeout=10).read()
            probe = socket.create_connection(("10.9.9.9", 80), timeout=5)
            probe.close()
        end = time.monotonic() + 5
        while not services.observations and time.monotonic() < end:
            time.sleep(0.01)  # the host thread accepts it
        observed = [o.detail for o in services.stop()]
    finally:
        services.close()
    assert json.loads(body)["data"][0]["id"] == "sim-1"
    assert observed == ["tcp connect to 10.9.9.9:80"]


def test_a_trial_runs_when_the_host_process_holds_over_1024_descriptors(
    isolating: Backend, run_harness: Runner
) -> None:
    # A long-running server (or a test process) holds many descriptors, so the ones a
    # trial opens are numbered 1024 and up, which select() refuses: the sandbox must wait
    # on them some other way.
    with holding_descriptors():
        result = run_harness(isolating, WELL_BEHAVED, stdin=b'{"numbers": [40, 2]}')
    assert result.exit_status == 0, result.stderr
    assert json.loads(result.stdout)["answer"] == 42
    assert result.isolation == "isolated"
