"""holedger.sandboxes: run one trial in isolation.

A ``SandboxSpec`` goes in, a ``SandboxResult`` comes out. Backends: ``bwrap`` (default on
Linux), ``docker``, and ``process`` (no isolation; only when asked for by name). See
docs/SANDBOXES.md for what each one isolates, limits and observes.
"""

from __future__ import annotations

from holedger.errors import SandboxError
from holedger.sandboxes.spec import (
    Backend,
    Limits,
    Observation,
    SandboxResult,
    SandboxSpec,
)

BACKEND_NAMES = ("bwrap", "docker", "process")
# Strongest first; "process" is never chosen automatically.
AUTOMATIC_ORDER = ("bwrap", "docker")

_BACKENDS: dict[str, Backend] = {}


def _make(name: str) -> Backend:
    if name not in _BACKENDS:
        if name == "bwrap":
            from holedger.sandboxes.bwrap import BwrapBackend

            _BACKENDS[name] = BwrapBackend()
        elif name == "docker":
            from holedger.sandboxes.docker_backend import DockerBackend

            _BACKENDS[name] = DockerBackend()
        elif name == "process":
            from holedger.sandboxes.process import ProcessBackend

            _BACKENDS[name] = ProcessBackend()
        else:
            raise SandboxError(
                f"unknown sandbox backend {name!r}", hint=f"one of {', '.join(BACKEND_NAMES)}"
            )
    return _BACKENDS[name]


def get_backend(name: str | None = None) -> Backend:
    """The named backend, or (None) the strongest available one: bwrap, then docker."""
    if name is not None:
        backend = _make(name)
        ok, why = backend.available()
        if not ok:
            raise SandboxError(
                f"sandbox backend {name!r} is unavailable: {why}", hint="run `holedger doctor`"
            )
        return backend
    reasons = []
    for candidate in AUTOMATIC_ORDER:
        backend = _make(candidate)
        ok, why = backend.available()
        if ok:
            return backend
        reasons.append(f"{candidate}: {why}")
    raise SandboxError(
        "no isolating sandbox backend is available (" + "; ".join(reasons) + ")",
        hint="install bubblewrap or start Docker; `--backend process` runs without isolation",
    )


def settle(timeout_s: float = 30.0) -> None:
    """Wait until the background teardown of finished trials (their cgroups and sockets,
    which bwrap removes off the trial's clock) is done; for benchmarks and tests."""
    if "bwrap" in _BACKENDS:
        from holedger.sandboxes.bwrap import settle as settle_bwrap

        settle_bwrap(timeout_s)


def available_backends() -> list[tuple[str, bool, str]]:
    """(name, works here, why) for every backend, strongest first."""
    out = []
    for name in BACKEND_NAMES:
        ok, why = _make(name).available()
        out.append((name, ok, why))
    return out


__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "Limits",
    "Observation",
    "SandboxResult",
    "SandboxSpec",
    "available_backends",
    "get_backend",
    "settle",
]
