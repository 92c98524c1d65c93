"""Attacks on the isolating backends (bwrap, docker): each must fail, and leave nothing behind.

Every test runs once per backend and is skipped, with the reason, where that backend does
not work. The ``run_harness`` fixture also checks, after each trial, that no process of
the trial is alive anywhere on the host.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import holedger
from holedger.sandboxes.spec import Backend, Limits, SandboxResult

Runner = Callable[..., SandboxResult]

pytestmark = pytest.mark.slow

PROBE = """
import json, os, sys
results = {}
for path in json.load(sys.stdin)["paths"]:
    try:
        with open(path, "rb") as f:
            results[path] = "READ " + f.read(40).decode("latin-1")
    except OSError as exc:
        results[path] = type(exc).__name__
    try:
        os.listdir(os.path.dirname(path))
        results[path] += " +dir-listed"
    except OSError:
        pass
print(json.dumps(results))
"""


@pytest.fixture
def host_secrets(tmp_path: Path) -> dict[str, Path]:
    """Stand-ins for what a trial must never read: they exist and are readable on the host."""
    made = {
        "secret": tmp_path / "secret" / "key.txt",
        "manifest": tmp_path / "tasks" / "demo" / "test.manifest.json",
        "ledger": tmp_path / "home" / "ledger.db",
        "key": tmp_path / "home" / "keys" / "operator.key",
    }
    for name, path in made.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"TOPSECRET-{name}")
    return made


def test_cannot_read_host_secrets(
    isolating: Backend, run_harness: Runner, host_secrets: dict[str, Path], code_dir: Path
) -> None:
    (code_dir / "leak").symlink_to(host_secrets["secret"])  # a symlink committed in the tree
    paths = [str(p) for p in host_secrets.values()]
    paths += ["/etc/shadow", str(Path(holedger.__file__)), "/root/.ssh/id_ed25519"]
    paths += ["/code/leak"]
    result = run_harness(isolating, PROBE, stdin=json.dumps({"paths": paths}).encode())
    assert result.exit_status == 0, result.stderr
    seen = json.loads(result.stdout)
    for path in paths:
        assert not seen[path].startswith("READ"), f"{path} was readable: {seen[path]}"
        listable = path in ("/etc/shadow", "/code/leak")  # /etc and /code exist inside
        outcome = seen[path].removesuffix(" +dir-listed") if listable else seen[path]
        assert outcome in ("FileNotFoundError", "PermissionError"), f"{path}: {seen[path]}"
    assert b"TOPSECRET" not in result.stdout


def test_holedger_is_not_importable_but_openai_is(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        import importlib.util, json
        print(json.dumps({m: importlib.util.find_spec(m) is not None
                          for m in ("holedger", "openai", "anthropic", "httpx", "pydantic",
                                    "pytest")}))
        """,
    )
    assert result.exit_status == 0, result.stderr
    assert json.loads(result.stdout) == {
        "holedger": False,
        "openai": True,
        "anthropic": True,
        "httpx": json.loads(result.stdout)["httpx"],  # whichever client openai depends on
        "pydantic": True,
        "pytest": False,
    }


def test_cannot_write_its_own_tree(isolating: Backend, run_harness: Runner, code_dir: Path) -> None:
    result = run_harness(
        isolating,
        """
        import json
        out = {}
        for path in ("/code/harness.py", "/code/new.txt", "/tmp/scratch.txt"):
            try:
                with open(path, "a") as f:
                    f.write("x")
                out[path] = "written"
            except OSError as exc:
                out[path] = exc.errno
        print(json.dumps(out))
        """,
    )
    out = json.loads(result.stdout)
    assert out["/code/harness.py"] in (13, 30)  # EACCES or EROFS
    assert out["/code/new.txt"] in (13, 30)
    assert out["/tmp/scratch.txt"] == "written"
    assert not (code_dir / "new.txt").exists()
    assert "x" not in (code_dir / "harness.py").read_text()[-2:]


def test_host_service_on_loopback_is_unreachable(isolating: Backend, run_harness: Runner) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    accepted: list[object] = []

    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        result = run_harness(
            isolating,
            f"""
            import socket
            s = socket.socket(); s.settimeout(3)
            try:
                s.connect(("127.0.0.1", {port})); print("CONNECTED")
            except OSError as exc:
                print("blocked", exc.errno)
            """,
        )
    finally:
        stop.set()
        thread.join(timeout=20)
        server.close()
    assert b"blocked" in result.stdout, result.stdout + result.stderr
    assert not accepted


def test_outside_address_is_blocked_and_observed(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        import socket
        for addr in (("192.0.2.10", 443), ("8.8.8.8", 12345)):
            s = socket.socket(); s.settimeout(3)
            try:
                s.connect(addr)
                print(addr, "got", s.recv(100))
            except OSError as exc:
                print(addr, "blocked", exc.errno)
        """,
    )
    assert result.exit_status == 0, result.stderr
    # Nothing came back from any outside peer.
    assert b"got b''" in result.stdout  # the recorder closes at once
    assert b"8.8.8.8', 12345) blocked" in result.stdout
    details = [o.detail for o in result.observations if o.category == "network_attempt"]
    assert "tcp connect to 192.0.2.10:443" in details


def test_dns_fails_and_is_observed(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        import socket
        try:
            print(socket.getaddrinfo("exfil.example.com", 443))
        except socket.gaierror as exc:
            print("no dns", exc.errno)
        """,
        limits=Limits(wall_s=30),
    )
    assert b"no dns" in result.stdout, result.stdout + result.stderr
    details = [o.detail for o in result.observations if o.category == "network_attempt"]
    assert "dns query for exfil.example.com" in details


def test_fork_bomb_is_contained(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        import os, time
        n = 0
        try:
            while n < 2000:
                if os.fork() == 0:
                    time.sleep(60); os._exit(0)
                n += 1
        except OSError:
            pass
        print(n)
        """,
        limits=Limits(wall_s=30, pids=32),
    )
    assert result.exit_status == 0, result.stderr
    assert int(result.stdout) < 32
    cats = result.categories()
    assert "process_limit" in cats
    assert "process_left_behind" in cats


def test_memory_past_the_limit_is_killed(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        chunks = []
        for _ in range(64):
            chunks.append(bytearray(16 * 1024 * 1024))
        print("survived")
        """,
        limits=Limits(wall_s=30, memory_mb=128),
    )
    assert b"survived" not in result.stdout
    assert result.oom
    assert result.exit_status == 137
    assert "out_of_memory" in result.categories()


def test_sleeping_past_the_timeout_kills_the_tree(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(600)
                os._exit(0)
        print("sleeping", flush=True)
        time.sleep(600)
        """,
        limits=Limits(wall_s=2),
    )
    assert result.timed_out
    assert result.exit_status is None
    assert result.stdout == b"sleeping\n"
    assert "timeout" in result.categories()


def test_daemon_outliving_the_harness_is_detected_and_killed(
    isolating: Backend, run_harness: Runner
) -> None:
    result = run_harness(
        isolating,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        print("done")
        """,
    )
    assert result.exit_status == 0
    assert not result.timed_out
    assert "process_left_behind" in result.categories()


def test_privileged_calls_are_denied_and_threads_work(
    isolating: Backend, run_harness: Runner
) -> None:
    result = run_harness(
        isolating,
        """
        import ctypes, json, os, subprocess, threading
        libc = ctypes.CDLL(None, use_errno=True)
        out = {}
        def call(label, name, *args):
            rc = getattr(libc, name)(*args)
            out[label] = 0 if rc == 0 else ctypes.get_errno()
        call("newuser", "unshare", 0x10000000)
        call("newnet", "unshare", 0x40000000)
        call("ptrace", "ptrace", 0, 0, 0, 0)  # PTRACE_TRACEME
        call("mount", "mount", b"none", b"/tmp", b"tmpfs", 0, None)
        box = []
        t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()
        out["thread"] = box
        out["subprocess"] = subprocess.run(["python3", "-c", "print(7)"],
                                           capture_output=True).stdout.decode().strip()
        out["uid"] = os.getuid()
        out["caps"] = [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1]
        print(json.dumps(out))
        """,
    )
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["newuser"] != 0 and out["newnet"] != 0 and out["mount"] != 0
    assert out["ptrace"] != 0  # holedger's policy on both (docker: its seccomp profile)
    assert out["thread"] == [1]
    assert out["subprocess"] == "7"
    assert out["uid"] == 65534
    assert int(out["caps"], 16) == 0


def test_environment_is_only_what_the_spec_gives(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        "import json, os; print(json.dumps(dict(os.environ)))",
        env={"OPENAI_API_KEY": "tok-123"},
    )
    env = json.loads(result.stdout)
    assert env["OPENAI_API_KEY"] == "tok-123"
    allowed = {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE"}
    allowed |= {"PYTHONNOUSERSITE"}
    allowed |= {"OPENAI_API_KEY", "HOLEDGER_TEST_MARK", "HOSTNAME", "PWD", "SHLVL", "_"}
    assert set(env) <= allowed, set(env) - allowed


def test_output_is_capped(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        "import sys; sys.stdout.write('y' * 300000); sys.stderr.write('e' * 10)",
        limits=Limits(wall_s=30, output_bytes=100000),
    )
    assert result.stdout == b"y" * 100000
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stderr == b"e" * 10
    assert "output_truncated" in result.categories()


def test_stale_trial_containers_are_collected(docker_backend: Backend) -> None:
    """A container left by a crashed holedger (deadline passed) is removed by label."""
    from holedger.sandboxes.docker_backend import LABEL, DockerBackend

    assert isinstance(docker_backend, DockerBackend)
    api = docker_backend.client.api
    stale = api.create_container(
        docker_backend.image,
        command=["/bin/sh", "-c", "sleep 600"],
        labels={LABEL: "1", "holedger.trial": "crashed", "holedger.deadline": "1"},
        host_config=api.create_host_config(network_mode="none"),
    )["Id"]
    fresh = api.create_container(
        docker_backend.image,
        command=["/bin/sh", "-c", "sleep 600"],
        labels={LABEL: "1", "holedger.trial": "running", "holedger.deadline": "99999999999"},
        host_config=api.create_host_config(network_mode="none"),
    )["Id"]
    try:
        api.start(stale)
        removed = docker_backend.collect_garbage()
        assert stale in removed
        assert fresh not in removed
        ids = {c["Id"] for c in api.containers(all=True, filters={"label": LABEL})}
        assert stale not in ids and fresh in ids
    finally:
        for cid in (stale, fresh):
            with contextlib.suppress(Exception):
                api.remove_container(cid, force=True)


def test_output_flood_stops_the_trial(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        """
        import sys
        block = "z" * 65536
        while True:
            sys.stdout.write(block)
        """,
        limits=Limits(wall_s=60, output_bytes=4096),
    )
    assert not result.timed_out
    assert result.stdout == b"z" * 4096 and result.stdout_truncated
    assert "output flood; trial stopped" in [o.detail for o in result.observations]


def test_cpu_time_limit_stops_a_busy_loop(isolating: Backend, run_harness: Runner) -> None:
    result = run_harness(
        isolating,
        "while True: pass",
        limits=Limits(wall_s=30, cpu_s=1),
    )
    assert not result.timed_out
    assert result.exit_status == 152  # SIGXCPU at the CPU-time rlimit
    assert "killed at the 1 s CPU-time limit" in [o.detail for o in result.observations]


def test_killing_its_parent_ends_only_its_own_trial(
    isolating: Backend, run_harness: Runner
) -> None:
    """bwrap: the wrapper dies and the trial ends as a sandbox error. docker: the parent is
    the container's init, which ignores the signal, so the trial runs into its timeout.
    Either way nothing of the trial survives (checked by the fixture)."""
    result = run_harness(
        isolating,
        """
        import os, signal, time
        if os.fork() == 0:
            os.setsid(); time.sleep(600)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(600)
        """,
        limits=Limits(wall_s=3),
    )
    assert result.exit_status is None or result.exit_status != 0
    assert {"sandbox_error", "timeout"} & set(result.categories())
