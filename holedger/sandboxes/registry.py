"""The sandbox backends by name, and the one place that knows which exist.

A backend is made on first use and kept for the process: what its set-up makes ahead of a
trial (bwrap's spare network namespace and cgroup) serves the next one. ``settle`` and
``close`` reach every backend made so far through the Backend interface.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from holedger.errors import SandboxError
from holedger.sandboxes.spec import Backend


def _factory(module: str, cls: str) -> Callable[[], Backend]:
    def make() -> Backend:
        backend: Backend = getattr(importlib.import_module(module), cls)()
        return backend

    return make


# Every backend, strongest first.
FACTORIES: dict[str, Callable[[], Backend]] = {
    "bwrap": _factory("holedger.sandboxes.bwrap", "BwrapBackend"),
    "docker": _factory("holedger.sandboxes.docker_backend", "DockerBackend"),
    "process": _factory("holedger.sandboxes.process", "ProcessBackend"),
}
BACKEND_NAMES = tuple(FACTORIES)
# Strongest first; "process" (no isolation) is never chosen automatically.
AUTOMATIC_ORDER = ("bwrap", "docker")

_made: dict[str, Backend] = {}


def backend(name: str) -> Backend:
    """The backend called ``name``, made on first use."""
    if name not in _made:
        factory = FACTORIES.get(name)
        if factory is None:
            raise SandboxError(
                f"unknown sandbox backend {name!r}", hint=f"one of {', '.join(BACKEND_NAMES)}"
            )
        _made[name] = factory()
    return _made[name]


def get_backend(name: str | None = None) -> Backend:
    """The named backend, or (None) the strongest available one: bwrap, then docker."""
    if name is not None:
        found = backend(name)
        ok, why = found.available()
        if not ok:
            raise SandboxError(
                f"sandbox backend {name!r} is unavailable: {why}", hint="run `holedger doctor`"
            )
        return found
    reasons = []
    for candidate in AUTOMATIC_ORDER:
        found = backend(candidate)
        ok, why = found.available()
        if ok:
            return found
        reasons.append(f"{candidate}: {why}")
    raise SandboxError(
        "no isolating sandbox backend is available (" + "; ".join(reasons) + ")",
        hint="install bubblewrap or start Docker; `--backend process` runs without isolation",
    )


def available_backends() -> list[tuple[str, bool, str]]:
    """(name, works here, why) for every backend, strongest first."""
    out = []
    for name in BACKEND_NAMES:
        ok, why = backend(name).available()
        out.append((name, ok, why))
    return out


def settle(timeout_s: float = 30.0) -> None:
    """Wait until every backend made so far has cleaned up after its finished trials."""
    for made in list(_made.values()):
        made.settle(timeout_s)


def close() -> None:
    """Clean up every backend made so far (what each made ahead for later trials)."""
    for made in list(_made.values()):
        made.close()
