"""The server's view of holedger.sandboxes: the contract types and backend lookup.

Trials run through ``holedger.sandboxes.get_backend``. Until a sandbox package provides
it, :class:`UnisolatedProcessBackend` runs the entrypoint as a plain child process,
recorded as ``isolation="none"`` with an ``unisolated_trial`` observation; it supports no
relays (so no gateway), and exists only so the protocol can run without a sandbox.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib import import_module
from typing import Any

from holedger.errors import SandboxError
from holedger.sandboxes.spec import Backend, Limits, Observation, SandboxResult, SandboxSpec


def get_backend(name: str | None = None) -> Backend:
    """``holedger.sandboxes.get_backend(name)``, or the unisolated fallback for "process"."""
    try:
        module: Any = import_module("holedger.sandboxes")
        lookup = module.get_backend
    except (ImportError, AttributeError):
        lookup = None
    if lookup is not None:
        backend: Backend = lookup(name)
        return backend
    if name in (None, "process"):
        return UnisolatedProcessBackend()
    raise SandboxError(f"sandbox backend {name!r} is not available here", hint="use 'process'")


class UnisolatedProcessBackend:
    """A child process with a timeout and capped output: no isolation at all."""

    name = "process"

    def available(self) -> tuple[bool, str]:
        return True, "always (no isolation)"

    def run(self, spec: SandboxSpec) -> SandboxResult:
        if spec.relays:
            raise SandboxError("the unisolated fallback cannot relay to a gateway")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(spec.code_dir),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            **spec.env,
        }
        argv = [sys.executable if a in ("python3", "python") else a for a in spec.argv]
        start = time.monotonic()
        timed_out = False
        try:
            proc = subprocess.run(
                argv,
                input=spec.stdin,
                capture_output=True,
                cwd=spec.code_dir,
                env=env,
                timeout=spec.limits.wall_s,
                check=False,
            )
            status: int | None = proc.returncode
            out, err = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            timed_out = True
            status = None
            out, err = exc.stdout or b"", exc.stderr or b""
        wall_ms = int((time.monotonic() - start) * 1000)
        cap = spec.limits.output_bytes
        observations = [Observation("unisolated_trial", "process backend: no isolation")]
        if timed_out:
            observations.append(Observation("timeout", f"killed after {spec.limits.wall_s}s"))
        return SandboxResult(
            exit_status=status,
            timed_out=timed_out,
            oom=False,
            stdout=out[:cap],
            stderr=err[:cap],
            stdout_truncated=len(out) > cap,
            stderr_truncated=len(err) > cap,
            wall_ms=wall_ms,
            cpu_ms=None,
            backend="process",
            isolation="none",
            limits_by="rlimit",
            observations=observations,
        )


__all__ = ["Backend", "Limits", "Observation", "SandboxResult", "SandboxSpec", "get_backend"]
