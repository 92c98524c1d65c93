"""What every demo command does around its runs: the sandbox backend, the home, the
server's API and gateway in this process on unix sockets in a private folder, the example
optimizer's read-only tree and sandbox, and its run followed in the ledger, with progress
bars, while the optimizer works."""

from __future__ import annotations

import concurrent.futures
import contextlib
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from holedger.config import Settings
from holedger.errors import SandboxError
from holedger.ledger.store import Ledger
from holedger.output import plain
from holedger.sandboxes import get_backend
from holedger.sandboxes.spec import Backend, Limits, SandboxResult, SandboxSpec

if TYPE_CHECKING:
    from holedger.server.serve import RunningServer

OPTIMIZER_SOURCE = Path(__file__).resolve().parent / "optimizer" / "optimizer.py"
OPTIMIZER_LIMITS = Limits(wall_s=1800.0, memory_mb=512, pids=64, output_bytes=8 << 20)
POLL_S = 0.25
T = TypeVar("T")


def choose_backend(name: str | None, say: Callable[[str], None]) -> Backend:
    """The named backend, or the strongest isolating one; ``process`` only as a loud last
    resort (trials and the optimizer then run unisolated, and replay says so)."""
    if name is not None:
        backend = get_backend(name)
    else:
        try:
            backend = get_backend(None)
        except SandboxError as exc:
            say(f"[bold red]WARNING[/]: {plain(exc.message)}")
            backend = get_backend("process")
    if backend.name == "process":
        say(
            "[bold red]WARNING: sandbox backend 'process' gives NO isolation: the optimizer "
            "and every trial run as ordinary processes on this machine. Replay flags each "
            "unisolated trial.[/]"
        )
    return backend


def ensure_home(cfg: Settings, say: Callable[[str], None]) -> None:
    """Create the home (operator key, SQLite ledger) when it has no key yet."""
    if not cfg.key_path.exists():
        Ledger.init_home(cfg)
        say(f"created the home {plain(cfg.home)}")


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free right now: the optimizer's relays listen on them (inside
    its sandbox, or on the host with the ``process`` backend, where fixed ports could
    collide with a running ``holedger serve``)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def prepare_optimizer_dir(root: Path, edits_dir: Path) -> Path:
    """The optimizer's read-only tree: the program and the prepared edits (its own plan).
    It reads the seed harness through the API, as any optimizer does."""
    opt = root / "optimizer"
    opt.mkdir()
    shutil.copyfile(OPTIMIZER_SOURCE, opt / "optimizer.py")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    if edits_dir.is_dir():
        shutil.copytree(edits_dir, opt / "edits", ignore=ignore)
    else:
        (opt / "edits").mkdir()
    for path in [opt, *opt.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return opt


def start_private_server(
    cfg: Settings, ledger: Ledger, private: Path, **options: Any
) -> RunningServer:
    """The API and the gateway in this process, each on a unix socket in ``private`` (a
    folder of this process's own: nothing listens on TCP); ``options`` go to start_server."""
    from holedger.server.serve import start_server

    private.chmod(0o711)
    return start_server(
        cfg,
        ledger,
        host=None,
        port=None,
        socket=private / "api.sock",
        gateway_port=None,
        gateway_socket=private / "gateway.sock",
        **options,
    )


@dataclass
class PrivateServer:
    """A demo's server and its ledger: ``ledger`` the server writes, ``reader`` a second
    connection that follows the runs, ``folder`` the private folder of its sockets (and
    of the optimizer's tree), ``runs_before`` the runs in the ledger before it started."""

    server: RunningServer
    ledger: Ledger
    reader: Ledger
    folder: Path
    runs_before: set[str]

    @property
    def sockets(self) -> tuple[Path, Path]:
        """The API's and the gateway's unix sockets."""
        return self.folder / "api.sock", self.folder / "gateway.sock"


@contextmanager
def private_server(
    cfg: Settings, *, prefix: str = "holedger-demo-", **options: Any
) -> Iterator[PrivateServer]:
    """The server of ``cfg``'s home started as start_private_server does (``options`` go
    to start_server); on leaving, stopped, its ledger connections closed and its private
    folder removed."""
    with contextlib.ExitStack() as stack:
        ledger = Ledger.from_settings(cfg)
        stack.callback(ledger.close)
        reader = Ledger.open(cfg.ledger_url, None, create_tables=False)
        stack.callback(reader.close)
        runs_before = set(reader.run_ids())
        folder = Path(tempfile.mkdtemp(prefix=prefix))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        server = start_private_server(cfg, ledger, folder, **options)
        stack.callback(server.stop)
        yield PrivateServer(server, ledger, reader, folder, runs_before)


def optimizer_spec(
    opt_dir: Path,
    run_id: str,
    token: str,
    sockets: tuple[Path, Path],
    args: Sequence[str],
    label: str = "optimizer",
) -> SandboxSpec:
    """The example optimizer's sandbox for ``run_id``: its tree, its arguments, and relays
    from two loopback ports to the API's and the gateway's unix sockets (``sockets``)."""
    api_port, gw_port = free_ports(2)
    return SandboxSpec(
        code_dir=opt_dir,
        argv=["python3", "optimizer.py", "--edits", "edits", *args],
        env={
            "HOLEDGER_API_URL": f"http://127.0.0.1:{api_port}/v1/runs/{run_id}",
            "HOLEDGER_API_TOKEN": token,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{gw_port}/v1",
            "OPENAI_API_KEY": token,
        },
        relays={api_port: sockets[0], gw_port: sockets[1]},
        limits=OPTIMIZER_LIMITS,
        label=f"{label}-{run_id[:8]}",
    )


def in_daemon_thread(fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
    """``fn(*args)`` in a daemon thread: an interrupted demo never waits at exit for it
    (a thread pool's workers are joined when the interpreter exits). A sandbox started
    from it dies with it (bubblewrap's --die-with-parent)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=work, name="demo", daemon=True).start()
    return future


class RunFollower:
    """Follows runs in the ledger from the main thread and counts what happened."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.after: dict[str, int] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.known = set(ledger.run_ids())

    def new_runs(self) -> list[str]:
        ids = [r for r in self.ledger.run_ids() if r not in self.known]
        return ids

    def poll(self, run_id: str) -> dict[str, int]:
        counts = self.counts.setdefault(run_id, {})
        after = self.after.get(run_id, -1)
        for rec in self.ledger.records(run_id, after_seq=after):
            after = rec.seq
            key = rec.type
            if rec.type == "TrialCompleted" and rec.payload.get("split") == "test":
                key = "HeldOutTrial"
            elif rec.type == "EvaluationRequested" and rec.payload.get("split") == "test":
                key = "HeldOutRequest"
            counts[key] = counts.get(key, 0) + 1
        self.after[run_id] = after
        return counts


def demo_progress(err: Console) -> Progress:
    """The progress bars of a demo, on ``err``: a description, the bar, done of total and
    the time taken."""
    return Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


def follow_optimizer(
    future: concurrent.futures.Future[SandboxResult],
    follower: RunFollower,
    run_id: str,
    progress: Progress,
    bars: dict[str, Any],
) -> SandboxResult:
    """Wait for the optimizer's sandbox (``future``), setting each of ``bars`` (an event
    key of RunFollower's counts, and its progress task) to ``run_id``'s count every
    POLL_S seconds, and once more when the optimizer has ended."""

    def tick() -> None:
        counts = follower.poll(run_id)
        for key, bar in bars.items():
            progress.update(bar, completed=counts.get(key, 0))

    while True:
        try:
            result = future.result(timeout=POLL_S)
            break
        except concurrent.futures.TimeoutError:
            tick()
    tick()
    return result


@contextmanager
def ticking(tick: Callable[[], None], poll_s: float = POLL_S) -> Iterator[None]:
    """Call ``tick`` every ``poll_s`` seconds in a daemon thread while the body runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(poll_s):
            with contextlib.suppress(Exception):  # a progress bar never breaks the demo
                tick()

    threading.Thread(target=loop, name="demo-progress", daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def exit_failure(result: SandboxResult, who: str) -> str | None:
    """What went wrong when the optimizer (``who``) timed out or exited non-zero, with
    the last lines of its stderr; None when it exited 0."""
    if result.exit_status == 0 and not result.timed_out:
        return None
    why = "timed out" if result.timed_out else f"exited with status {result.exit_status}"
    tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
    return f"the {who} {why}: {' | '.join(tail)}"
