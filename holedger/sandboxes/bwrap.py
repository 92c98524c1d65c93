"""The bubblewrap backend: the default on Linux.

One trial = one bwrap sandbox:

* namespaces: user (uid/gid 65534, no capabilities, no nested user namespaces), pid, ipc,
  uts, cgroup, mount, and a network namespace with only loopback that holedger creates and
  owns (see ``netns``); ``--die-with-parent`` and ``--new-session``;
* filesystem: an allowlist. ``/usr`` and the interpreter's own files read-only with every
  site-packages directory masked, the harness runtime at /opt/holedger/runtime, synthetic
  /etc files, the candidate read-only at /code (the cwd), a size-limited private /tmp and
  /dev/shm, five device nodes in an otherwise read-only /dev;
* seccomp: holedger's own filter (``seccomp``);
* limits: a per-trial cgroup (v2 or v1) when holedger may make one, else rlimits;
* the whole tree dies at the timeout (cgroup freeze + kill, or the pid namespace's init).

holedger starts bwrap from the calling thread (the parent ``--die-with-parent`` watches),
moved for the moment into the trial's network namespace (made ahead, or made now) and,
with cgroup v1, into the trial's group (made ahead too); with v2 a small sh step first
moves itself into the group, then becomes bwrap. While bwrap builds the sandbox, holedger
binds the relays (and the recorder, unless made ahead) in the namespace; bwrap waits at
``--block-fd`` until holedger has given the sandbox's init the trial's rlimits, so the
harness starts confined.

Inside, a small sh wrapper (pid 2) runs the harness, reports its exit status over a
socket the harness cannot reopen, and waits; holedger then lists what else still runs in
the pid namespace (leftover processes, ``process_left_behind``) and kills the namespace's
init, which takes everything else along. Removing the cgroup and closing the sockets
happen off the trial's clock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from holedger.errors import SandboxError
from holedger.sandboxes import cgroups
from holedger.sandboxes.bwrap_trial import STDIN_PATH, CgroupPool, NetnsPool, Trial
from holedger.sandboxes.common import Janitor, sandbox_env
from holedger.sandboxes.runtime import Interpreter
from holedger.sandboxes.seccomp import filter_for_host
from holedger.sandboxes.spec import (
    BIN_DIR,
    CODE_DIR,
    RUNTIME_DIR,
    SANDBOX_GID,
    SANDBOX_UID,
    SandboxResult,
    SandboxSpec,
)

# Runs inside as pid 2: runs the harness, reports its exit status, then waits for good
# (holedger ends the sandbox). bwrap's stdin is the status channel, one end of a socket
# pair: a socket cannot be reopened through /proc/PID/fd, so the harness cannot write a
# status of its own there. The harness gets its stdin from STDIN_PATH, bwrap's stdout and
# stderr (the trial's output files), and no other descriptor.
WRAPPER = (
    f'exec 3<&0 <{STDIN_PATH} 5>&2 2>/dev/null; "$@" 2>&5 5>&- 3>&-; rc=$?; echo "$rc" >&3; '
    "read _ <&3; exit $rc"
)
# The device nodes a sandbox gets (no tty: a trial has no controlling terminal).
DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _find(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/bin/{name}") if os.access(p, os.X_OK)), None
    )


@lru_cache(maxsize=1)
def _bwrap_version(path: str) -> tuple[int, ...]:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    digits = out.stdout.strip().split()[-1] if out.stdout.strip() else "0"
    return tuple(int(x) for x in digits.split(".") if x.isdigit())


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _interpreter_lib(interp: Interpreter) -> Path:
    """What to bind for the standard library: its parent directory (one mount for it and
    libpython) when that holds only the interpreter's own files, else the stdlib alone."""
    parent = interp.stdlib.parent
    if interp.shared_lib is None or interp.shared_lib.parent != parent:
        return interp.stdlib
    try:
        for entry in os.scandir(parent):
            if entry.name == "pkgconfig" and entry.is_dir(follow_symlinks=False):
                if all(n.startswith("python") for n in os.listdir(entry.path)):
                    continue
            elif entry.path == str(interp.stdlib) or entry.name.startswith("libpython"):
                continue
            return interp.stdlib
    except OSError:
        return interp.stdlib
    return parent


@lru_cache(maxsize=16)
def _static_args(
    bwrap: str,
    interp: Interpreter,
    runtime: Path,
    etc: Path,
    empty: Path,
    tmp_mb: int,
    extra: tuple[Path, ...],
    disable_userns: bool,
) -> tuple[str, ...]:
    """The part of bwrap's command line that is the same for every trial of a setup."""
    a: list[str] = [
        bwrap,
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    if disable_userns:
        # The seccomp filter already denies new user namespaces, and this costs ~5 ms.
        a += ["--disable-userns"]
    a += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            a += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            a += ["--ro-bind", str(host), f"/{top}"]
    a += ["--ro-bind", str(etc), "/etc"]  # one mount: every bind costs bwrap ~0.3 ms
    a += ["--proc", "/proc"]
    # A minimal /dev on the root (read-only at the end): the device nodes, not bwrap's
    # --dev (a writable tmpfs without a size, six nodes, a devpts instance).
    for node in DEV_NODES:
        if Path(f"/dev/{node}").is_char_device():
            a += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        a += ["--symlink", f"/proc/self/fd/{fd}", f"/dev/{name}"]
    a += ["--symlink", "/proc/self/fd", "/dev/fd"]
    a += ["--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    # Writable, so sized like /tmp: without cgroups a harness could otherwise fill host
    # memory through it.
    a += ["--perms", "1777", "--size", str(tmp_mb * 1024 * 1024)]
    a += ["--tmpfs", "/dev/shm"]
    lib = _interpreter_lib(interp)
    visible = [Path("/usr"), lib]
    a += ["--ro-bind", str(lib), str(lib)]
    if not _under(interp.executable, visible):
        a += ["--ro-bind", str(interp.executable), str(interp.executable)]
    if interp.shared_lib and not _under(interp.shared_lib, visible):
        a += ["--ro-bind", str(interp.shared_lib), str(interp.shared_lib)]
    for path in extra:
        a += ["--ro-bind", str(path), str(path)]
    for hidden in interp.hidden:
        if _under(hidden, visible + list(extra)):
            a += ["--ro-bind", str(empty), str(hidden)]
    a += ["--ro-bind", str(runtime), RUNTIME_DIR]
    a += ["--dir", BIN_DIR]
    for name in ("python3", "python"):
        a += ["--symlink", str(interp.executable), f"{BIN_DIR}/{name}"]
    return tuple(a)


class BwrapBackend:
    """Trials in bubblewrap sandboxes."""

    name = "bwrap"

    def __init__(self, bwrap: str | None = None, seccomp: bool = True) -> None:
        self.bwrap = bwrap or _find("bwrap")
        self.sh = _find("sh")
        self.use_seccomp = seccomp
        self._available: tuple[bool, str] | None = None
        # Set-up made ahead for the next trial, and the clean-up of finished ones, both
        # off the trials' clock.
        self.janitor = Janitor()
        self.netns = NetnsPool()
        self.cgroups = CgroupPool(self.janitor)

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until the teardown queued by finished trials is done."""
        self.janitor.drain(timeout_s)

    def close(self) -> None:
        """Remove the namespace and cgroup made ahead for a next trial."""
        self.settle()
        self.netns.close()
        self.cgroups.close()

    # ------------------------------------------------------------------ availability

    def available(self) -> tuple[bool, str]:
        if self._available is None:
            self._available = self._probe()
        return self._available

    def _probe(self) -> tuple[bool, str]:
        if not self.bwrap:
            return False, "bwrap not found (apt-get install bubblewrap)"
        if not self.sh:
            return False, "sh not found"
        if os.geteuid() != 0:
            return False, "needs root: holedger builds each trial's network namespace itself"
        try:
            version = _bwrap_version(self.bwrap)
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"bwrap does not run: {exc}"
        probe = subprocess.run(
            [
                self.bwrap,
                "--unshare-all",
                "--unshare-user",
                "--uid",
                str(SANDBOX_UID),
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/bin",
                "/bin",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
                "--",
                "/usr/bin/true",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            return False, f"bwrap cannot make namespaces: {probe.stderr.strip()[:200]}"
        cg = cgroups.manager()
        limits = cg.reason if cg.usable else f"rlimits ({cg.reason})"
        _, sec = filter_for_host()
        return True, f"bwrap {'.'.join(map(str, version))}; limits by {limits}; {sec}"

    # ------------------------------------------------------------------ argv

    def build_argv(
        self,
        spec: SandboxSpec,
        *,
        interp: Interpreter,
        runtime: Path,
        etc: Path,
        empty: Path,
        seccomp_fd: int | None,
        info_fd: int,
        block_fd: int,
        stdin_fd: int,
    ) -> list[str]:
        """The bwrap command line for ``spec`` (no side effects; unit-testable).

        bwrap copies the trial's stdin from ``stdin_fd`` to STDIN_PATH; ``block_fd``
        holds the sandbox back, set up, until holedger has given it its rlimits."""
        assert self.bwrap
        extra = tuple(Path(p).resolve() for p in spec.extra_ro_binds)
        disable_userns = seccomp_fd is None and _bwrap_version(self.bwrap) >= (0, 8)
        a = list(
            _static_args(
                self.bwrap, interp, runtime, etc, empty, spec.limits.tmp_mb, extra, disable_userns
            )
        )
        a += ["--ro-bind", str(Path(spec.code_dir).resolve()), CODE_DIR, "--chdir", CODE_DIR]
        a += ["--dir", str(Path(STDIN_PATH).parent), "--perms", "0444"]
        a += ["--file", str(stdin_fd), STDIN_PATH]
        # Last: the root itself (a tmpfs without a size) read-only, or a harness could fill
        # host memory through it when there is no cgroup.
        a += ["--remount-ro", "/"]
        # No environment here: bwrap's command line is readable by every local user
        # (/proc/PID/cmdline), and the environment carries the trial's token. bwrap gets
        # the sandbox's environment as its own (see ``environment``) and passes it on.
        if seccomp_fd is not None:
            a += ["--seccomp", str(seccomp_fd)]
        a += ["--info-fd", str(info_fd), "--block-fd", str(block_fd)]
        a += ["--", "/bin/sh", "-c", WRAPPER, "wrapper", *spec.argv]
        return a

    @staticmethod
    def environment(spec: SandboxSpec) -> dict[str, str]:
        """bwrap's own environment, which it hands to the sandbox unchanged: the harness's
        whole environment. Tokens travel here, never on the command line; a process's
        environment is readable only by its own user (and bwrap's init, pid 1 inside,
        carries just this)."""
        return sandbox_env(spec)

    # ------------------------------------------------------------------ run

    def run(self, spec: SandboxSpec) -> SandboxResult:
        ok, why = self.available()
        if not ok:
            raise SandboxError(f"the bwrap backend is unavailable: {why}")
        if not Path(spec.code_dir).is_dir():
            raise SandboxError(f"code directory {spec.code_dir} does not exist")
        for sock in spec.relays.values():
            if not Path(sock).exists():
                raise SandboxError(f"relay target {sock} does not exist")
        try:
            return Trial(self, spec).run()
        except OSError as exc:
            raise SandboxError(f"the bwrap sandbox failed to start: {exc}") from exc
