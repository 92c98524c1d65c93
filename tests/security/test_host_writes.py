"""No trial writes to the host beyond its limits, whatever route it takes.

A harness tries every way out to a file it could know: its own stdout and stderr, the
container entrypoint's or the sandbox init's (/proc/1/fd/1 and 2, which in Docker were
the container's log pipe into dockerd's log file on the host), /dev/stdout, and the
entrypoint's status channel. While the trial runs, the test watches every file the trial
could reach on the host (the trial's private directory and, for Docker, the container's
directory in the engine's data root, where a log would be) and finds none that grew by the
output cap. Each route that bypasses the harness's own output is stopped and recorded.

Also: a harness cannot ptrace-stop its entrypoint (or the sandbox's init) to make its trial
run to the timeout.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from holedger.sandboxes.spec import Backend, Limits, SandboxResult, SandboxSpec

pytestmark = pytest.mark.slow

CAP = 64 * 1024
WRITE = """
import os, sys
target = {target!r}
try:
    fd = os.open(target, os.O_WRONLY) if target.startswith("/") else int(target)
except OSError as exc:
    print("refused", exc.errno)
    sys.exit(0)
block = b"x" * (1 << 20)
try:
    for _ in range(256):
        os.write(fd, block)
except OSError as exc:
    print("stopped", exc.errno)
"""
ROUTES = {
    "own stdout": "1",
    "own stderr": "2",
    "/dev/stdout": "/dev/stdout",
    "/proc/self/fd/1": "/proc/self/fd/1",
    "entrypoint stdout": "/proc/1/fd/1",
    "entrypoint stderr": "/proc/1/fd/2",
    "status channel": "/run/holedger/out/status",
}


class Watch:
    """The largest size any regular file under ``roots`` reached while watched."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self.largest = 0
        self.where = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self) -> None:
        for root in self.roots:
            for dirpath, _dirs, files in os.walk(root):
                for name in files:
                    path = os.path.join(dirpath, name)
                    try:
                        size = os.lstat(path).st_size
                    except OSError:
                        continue
                    if size > self.largest and os.path.isfile(path):
                        self.largest, self.where = size, path

    def _run(self) -> None:
        while not self._stop.is_set():
            self._scan()
            time.sleep(0.01)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._scan()


def _roots(backend: Backend, tmp: Path) -> list[Path]:
    roots = [tmp]
    if backend.name == "docker":
        client = backend.client  # type: ignore[attr-defined]
        roots.append(Path(client.info()["DockerRootDir"]) / "containers")
    return roots


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The trial's host-side directories go here, where the watch can see all of them."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def _run(backend: Backend, code: Path, source: str, wall_s: float = 30) -> SandboxResult:
    (code / "harness.py").write_text(source)
    spec = SandboxSpec(
        code_dir=code,
        argv=["python3", "harness.py"],
        limits=Limits(wall_s=wall_s, output_bytes=CAP),
        label="host-writes",
    )
    return backend.run(spec)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_no_route_writes_past_the_cap_to_a_host_file(
    isolating: Backend, route: str, private_tmp: Path, tmp_path: Path
) -> None:
    if route == "status channel" and isolating.name != "docker":
        pytest.skip("bwrap reports the status over a socket the harness cannot reopen")
    code = tmp_path / "code"
    code.mkdir()
    if isolating.name == "docker":
        before = {p.name for p in _roots(isolating, private_tmp)[1].iterdir()}
    with Watch(_roots(isolating, private_tmp)) as watch:
        result = _run(isolating, code, WRITE.format(target=ROUTES[route]))
    assert watch.largest <= CAP + 1, f"{watch.where} grew to {watch.largest} bytes"
    assert not result.timed_out
    assert len(result.stdout) <= CAP and len(result.stderr) <= CAP
    text = result.stdout.decode(errors="replace")
    if "refused" in text:
        return  # the route does not exist there at all
    categories = result.categories()
    if route.startswith("entrypoint") and isolating.name == "docker":
        # the container's log pipe: kept nowhere, recorded, trial stopped
        assert "host_write" in categories, result.observations
        assert result.exit_status is None
        after = {p.name for p in _roots(isolating, private_tmp)[1].iterdir()}
        for cid in after - before:  # a container still being removed
            log = _roots(isolating, private_tmp)[1] / cid / f"{cid}-json.log"
            assert not log.exists() or log.stat().st_size == 0
    else:
        # the harness's own output (in bwrap /proc/1/fd/1 is bwrap's stdout, the trial's):
        # capped, the flood stopped and recorded
        assert "output_truncated" in categories, result.observations
        assert any("flood" in o.detail for o in result.observations), result.observations


PTRACE_STOP = """
import ctypes, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
seized = libc.ptrace(0x4206, 1, None, None)  # PTRACE_SEIZE the entrypoint / init
errno_seize = ctypes.get_errno()
stopped = libc.ptrace(0x4207, 1, None, None)  # PTRACE_INTERRUPT: stop it
attached = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH
errno_attach = ctypes.get_errno()
print(json.dumps({"seize": [seized, errno_seize], "attach": [attached, errno_attach]}))
"""


def test_the_entrypoint_cannot_be_ptrace_stopped(
    isolating: Backend, private_tmp: Path, tmp_path: Path
) -> None:
    import json

    code = tmp_path / "code"
    code.mkdir()
    result = _run(isolating, code, PTRACE_STOP, wall_s=30)
    assert not result.timed_out, result.observations
    assert result.exit_status == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["seize"][0] == -1 and out["seize"][1] == 1  # EPERM
    assert out["attach"][0] == -1 and out["attach"][1] == 1
