"""Fixtures for the security tests: the sandbox room's real backends and harness runner."""

from __future__ import annotations

from tests.sandboxes.conftest import (
    backend_or_skip,
    bwrap_backend,
    code_dir,
    docker_backend,
    isolating,
    run_harness,
)

__all__ = [
    "backend_or_skip",
    "bwrap_backend",
    "code_dir",
    "docker_backend",
    "isolating",
    "run_harness",
]
