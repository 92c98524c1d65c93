"""holedger.sandboxes: run one trial in isolation.

A ``SandboxSpec`` goes in, a ``SandboxResult`` comes out. Backends (``registry.py``):
``bwrap`` (default on Linux), ``docker``, and ``process`` (no isolation; only when asked
for by name). See docs/SANDBOXES.md for what each one isolates, limits and observes.
"""

from __future__ import annotations

from holedger.sandboxes.registry import (
    AUTOMATIC_ORDER,
    BACKEND_NAMES,
    available_backends,
    close,
    get_backend,
    settle,
)
from holedger.sandboxes.spec import (
    Backend,
    Limits,
    Observation,
    SandboxResult,
    SandboxSpec,
)

__all__ = [
    "AUTOMATIC_ORDER",
    "BACKEND_NAMES",
    "Backend",
    "Limits",
    "Observation",
    "SandboxResult",
    "SandboxSpec",
    "available_backends",
    "close",
    "get_backend",
    "settle",
]
