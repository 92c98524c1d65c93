"""The plain, typed messages between the server and its Ray driver process, and between
the driver and a node's worker: one JSON object per line, bytes in base64.

The server never unpickles what comes from the cluster: the Ray driver (a process of its
own, ``ray_driver.py``) passes the node's result on as the JSON the node wrote, and the
server decodes it here field by field, refusing anything of the wrong type. A message
that does not decode is a :class:`WireError`; the server records such a trial as not run.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from typing import Any

from holedger.errors import SandboxError
from holedger.sandboxes import SandboxResult
from holedger.sandboxes.spec import Observation

MAX_LINE = 64 << 20  # a result holds at most two capped outputs, in base64


class WireError(SandboxError):
    """A message that is not what the protocol says."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise WireError(f"{what} is not base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError:
        raise WireError(f"{what} is not base64 text") from None


def field(obj: Any, name: str, *types: type) -> Any:
    """``obj[name]``, which must be one of ``types`` (bool is not an int here)."""
    if not isinstance(obj, dict) or name not in obj:
        raise WireError(f"a message lacks {name!r}")
    value = obj[name]
    if isinstance(value, bool) and bool not in types:
        raise WireError(f"{name!r} has the wrong type")
    if not isinstance(value, types):
        raise WireError(f"{name!r} has the wrong type")
    return value


# ------------------------------------------------------------------ results


def result_to_json(result: SandboxResult) -> dict[str, Any]:
    return {
        "exit_status": result.exit_status,
        "timed_out": result.timed_out,
        "oom": result.oom,
        "stdout": b64(result.stdout),
        "stderr": b64(result.stderr),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "wall_ms": result.wall_ms,
        "cpu_ms": result.cpu_ms,
        "backend": result.backend,
        "isolation": result.isolation,
        "limits_by": result.limits_by,
        "observations": [[o.category, o.detail] for o in result.observations],
        "node": result.node,
    }


def result_from_json(obj: Any) -> SandboxResult:
    isolation = field(obj, "isolation", str)
    if isolation not in ("isolated", "none"):
        raise WireError("'isolation' is neither isolated nor none")
    observations = []
    for item in field(obj, "observations", list):
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        ):
            raise WireError("an observation is not [category, detail]")
        observations.append(Observation(item[0], item[1]))
    return SandboxResult(
        exit_status=field(obj, "exit_status", int, type(None)),
        timed_out=field(obj, "timed_out", bool),
        oom=field(obj, "oom", bool),
        stdout=unb64(field(obj, "stdout", str), "stdout"),
        stderr=unb64(field(obj, "stderr", str), "stderr"),
        stdout_truncated=field(obj, "stdout_truncated", bool),
        stderr_truncated=field(obj, "stderr_truncated", bool),
        wall_ms=field(obj, "wall_ms", int),
        cpu_ms=field(obj, "cpu_ms", int, type(None)),
        backend=field(obj, "backend", str),
        isolation=isolation,
        limits_by=field(obj, "limits_by", str),
        observations=observations,
        node=field(obj, "node", str, type(None)),
    )


# ------------------------------------------------------------------ lines on a socket


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        raise WireError("a message is not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise WireError("a message is not an object with an 'op'")
    return message


class Channel:
    """One end of a socket carrying messages both ways; :meth:`send` is thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        with self._lock:
            self.sock.sendall(data)

    def receive(self) -> dict[str, Any] | None:
        """The next message; None when the other end has gone (or :meth:`close` ran).
        One thread reads."""
        try:
            line = self._reader.readline(MAX_LINE)
        except (OSError, ValueError):
            line = b""
        if not line:
            self._reader.close()  # here, in the reading thread: never under its read
            return None
        if not line.endswith(b"\n"):
            raise WireError("a message is too long")
        return decode(line)

    def close(self) -> None:
        """End both ways: a read waiting in another thread sees the end at once."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
