"""Fixtures for the sandbox tests: real backends, real harness code, real host secrets."""

from __future__ import annotations

import os
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from holedger.sandboxes import get_backend
from holedger.sandboxes.spec import Backend, Limits, SandboxResult, SandboxSpec

MARK = "HOLEDGER_TEST_MARK"
ISOLATING = ("bwrap", "docker")


def backend_or_skip(name: str) -> Backend:
    from holedger.sandboxes.registry import backend as named

    backend = named(name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(f"{name} backend unavailable: {why}")
    return backend


@pytest.fixture(params=ISOLATING)
def isolating(request: pytest.FixtureRequest) -> Backend:
    """Each isolating backend in turn (skipped, with the reason, where it does not work)."""
    return backend_or_skip(request.param)


@pytest.fixture(params=("bwrap", "docker", "process"))
def every_backend(request: pytest.FixtureRequest) -> Backend:
    return backend_or_skip(request.param)


@pytest.fixture
def docker_backend() -> Backend:
    return backend_or_skip("docker")


@pytest.fixture
def bwrap_backend() -> Backend:
    return backend_or_skip("bwrap")


@pytest.fixture
def process_backend() -> Backend:
    return backend_or_skip("process")


def survivors(mark: str) -> list[int]:
    """Host processes whose environment carries ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(d))
            except OSError:
                pass
    return found


def assert_nothing_survives(mark: str) -> None:
    end = time.monotonic() + 3
    while survivors(mark) and time.monotonic() < end:
        time.sleep(0.05)
    left = survivors(mark)
    assert not left, f"processes of the trial survived: {left}"


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    d = tmp_path / "candidate"
    d.mkdir()
    return d


Runner = Callable[..., SandboxResult]


@pytest.fixture
def run_harness(code_dir: Path) -> Iterator[Runner]:
    """Write ``source`` as harness.py into the candidate tree and run it; then check that
    no process of the trial is left anywhere on the host."""
    marks: list[str] = []

    def run(
        backend: Backend,
        source: str,
        *,
        stdin: bytes = b"{}",
        limits: Limits | None = None,
        env: dict[str, str] | None = None,
        relays: dict[int, Path] | None = None,
    ) -> SandboxResult:
        (code_dir / "harness.py").write_text(textwrap.dedent(source))
        mark = uuid.uuid4().hex
        marks.append(mark)
        spec = SandboxSpec(
            code_dir=code_dir,
            argv=["python3", "harness.py"],
            stdin=stdin,
            env={MARK: mark, **(env or {})},
            relays=relays or {},
            limits=limits or Limits(wall_s=30),
            label="test",
        )
        return backend.run(spec)

    yield run
    for mark in marks:
        assert_nothing_survives(mark)


__all__ = ["Runner", "assert_nothing_survives", "backend_or_skip", "get_backend"]
