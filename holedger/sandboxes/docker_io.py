"""What a docker trial writes, kept off the host's disk, and the container's seccomp profile.

Every stream between the container and holedger is a named pipe (FIFO) in the trial's
private host directory, never a regular file: the harness's stdout and stderr, the
entrypoint's exit status, and the entrypoint's own stdout and stderr. holedger holds each
read end from before the container starts and drains it while the trial runs, keeping at
most the output cap (plus one byte, to see truncation) and counting the rest. Nothing a
trial writes reaches a host file, whatever route it takes (reopening /proc/self/fd/1 or
/proc/1/fd/1 opens the same pipe), and a writer can get at most one pipe buffer ahead of
holedger.

The entrypoint's own stdout and stderr would otherwise be the container's log pipe, which
dockerd copies into a log file on the host (the trial has no log driver now, so there is
none). Here they are a tripwire: the entrypoint never writes to them, so any byte there
came from the harness (``/proc/1/fd/1``) and is recorded as ``host_write``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
from functools import lru_cache
from pathlib import Path

from holedger.sandboxes.common import OUTPUT_FLOOD_FACTOR
from holedger.sandboxes.seccomp import CLONE_NS_FLAGS, X86_64_DENIED
from holedger.sandboxes.spec import SANDBOX_GID, SANDBOX_UID

STREAMS = ("stdout", "stderr", "status", "entry")
STATUS_MAX_BYTES = 16
F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20

# The container's command: the entrypoint's stdout and stderr become the tripwire pipe
# (and stop being the container's log pipe), then the entrypoint runs.
ENTRY_SHELL = 'exec >"$0" 2>&1 </dev/null; exec "$@"'


class FifoStreams:
    """The read ends of one trial's pipes, drained into capped buffers."""

    def __init__(self, directory: Path, output_bytes: int) -> None:
        self.cap = output_bytes
        self.flood_at = output_bytes * OUTPUT_FLOOD_FACTOR + 65536
        self.fds: dict[str, int] = {}
        self.kept: dict[str, bytearray] = {name: bytearray() for name in STREAMS}
        self.total: dict[str, int] = dict.fromkeys(STREAMS, 0)
        try:
            for name in STREAMS:
                path = directory / name
                os.mkfifo(path, 0o600)
                os.chown(path, SANDBOX_UID, SANDBOX_GID)  # the container's uid writes
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                self.fds[name] = fd
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            self.close()
            raise

    def pump(self) -> None:
        """Read whatever is waiting in every pipe (never blocks)."""
        for name, fd in self.fds.items():
            keep = (self.cap + 1) if name in ("stdout", "stderr") else (STATUS_MAX_BYTES + 1)
            while self.total[name] <= self.flood_at:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EINTR:
                        continue
                    break
                if not chunk:
                    break  # no writer now (one may still come)
                self.total[name] += len(chunk)
                room = keep - len(self.kept[name])
                if room > 0:
                    self.kept[name] += chunk[:room]

    def flooded(self) -> bool:
        return any(self.total[n] > self.flood_at for n in ("stdout", "stderr"))

    def status_flooded(self) -> bool:
        return self.total["status"] > STATUS_MAX_BYTES

    def status(self) -> int | None:
        """The entrypoint's exit status line, once it is whole."""
        data = bytes(self.kept["status"])
        if self.status_flooded() or not data.endswith(b"\n"):
            return None
        text = data.decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None

    def host_writes(self) -> int:
        """Bytes written to the entrypoint's own stdout and stderr (the tripwire)."""
        return self.total["entry"]

    def outputs(self) -> tuple[tuple[bytes, bool], tuple[bytes, bool]]:
        out = []
        for name in ("stdout", "stderr"):
            data = bytes(self.kept[name])
            out.append((data[: self.cap], self.total[name] > self.cap))
        return out[0], out[1]

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = {}


@lru_cache(maxsize=1)
def seccomp_profile() -> str | None:
    """The container's seccomp profile (Docker's JSON form), the same policy as the bwrap
    filter: ptrace, mount, unshare, setns, keyctl, bpf, ... denied with EPERM, clone with a
    namespace flag denied, clone3 answered ENOSYS (glibc then uses clone); everything else
    allowed. None off x86_64, where Docker's default profile stays."""
    if platform.machine() not in ("x86_64", "amd64", "AMD64"):
        return None
    rules: list[dict[str, object]] = [
        {"names": sorted(X86_64_DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
    ]
    bit = 1
    while bit <= CLONE_NS_FLAGS:
        if CLONE_NS_FLAGS & bit:
            rules.append(
                {
                    "names": ["clone"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": errno.EPERM,
                    "args": [
                        {"index": 0, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}
                    ],
                }
            )
        bit <<= 1
    profile = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": rules,
    }
    return json.dumps(profile, sort_keys=True)
