"""The server's end of its Ray driver process (``ray_driver.py``).

:class:`DriverLink` starts the driver as a child process with one end of a socket pair,
waits for it to join the cluster, then reads its messages in a thread: answers to
``nodes`` asks go to the waiting caller, each ``done`` to the executor's callback. When
the driver's end closes (it exited, Ray ended it, or it was killed), the link is gone and
the executor's ``on_gone`` callback runs once.
"""

from __future__ import annotations

import collections
import itertools
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from holedger.executors.wire import Channel, WireError

START_TIMEOUT_S = 120.0  # Ray's own start of a driver takes seconds on a busy machine
STOP_TIMEOUT_S = 5.0


class DriverFailed(Exception):
    """The driver did not join the cluster; the message says why, on one line."""


class DriverLink:
    def __init__(
        self,
        address: str,
        on_done: Callable[[dict[str, Any]], None],
        on_gone: Callable[[DriverLink], None],
    ) -> None:
        self.address = address
        self._on_done = on_done
        self._on_gone = on_gone
        self._seq = itertools.count()
        self._asks: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self.gone = threading.Event()
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "holedger.executors.ray_driver"),
                    *("--fd", str(theirs.fileno()), address),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        finally:
            theirs.close()
        assert self.proc.stderr is not None
        threading.Thread(target=self._drain, daemon=True, name="holedger-driver-log").start()
        self.channel = Channel(ours)
        ours.settimeout(START_TIMEOUT_S)
        try:
            first = self.channel.receive()
        except (OSError, WireError):
            first = None
        ours.settimeout(None)
        if first is None or first.get("op") != "ready":
            why = first.get("message") if first and first.get("op") == "failed" else None
            self.kill()
            raise DriverFailed(str(why or self.last_words() or "the Ray driver did not start"))
        self.node = str(first.get("node"))
        self.first_nodes: dict[str, float] = dict(first.get("nodes") or {})
        threading.Thread(target=self._read, daemon=True, name="holedger-driver-read").start()

    def alive(self) -> bool:
        return not self.gone.is_set() and self.proc.poll() is None

    def run(self, message: dict[str, Any]) -> None:
        """Send a ``run``; an OSError when the driver has gone."""
        self.channel.send({"op": "run", **message})

    def nodes(self, timeout: float) -> tuple[dict[str, float], bool]:
        """(live nodes offering the resource, whether the driver's own node is in the
        cluster); a DriverFailed when the driver cannot say within ``timeout``."""
        seq = next(self._seq)
        asked: Future[dict[str, Any]] = Future()
        with self._lock:
            self._asks[seq] = asked
        try:
            self.channel.send({"op": "nodes", "seq": seq})
            reply = asked.result(timeout)
        except OSError:
            raise DriverFailed("the Ray driver has gone") from None
        except TimeoutError:
            raise DriverFailed(f"the Ray driver gave no answer within {timeout:.0f} s") from None
        finally:
            with self._lock:
                self._asks.pop(seq, None)
        if "error" in reply:
            raise DriverFailed(str(reply["error"]))
        nodes = reply.get("nodes")
        if not isinstance(nodes, dict):
            raise DriverFailed("the Ray driver's answer holds no nodes")
        return {str(k): float(v) for k, v in nodes.items()}, bool(reply.get("attached"))

    def last_words(self) -> str:
        """The driver's last line on its error stream (Ray's reason for ending it)."""
        lines = [line for line in self._stderr if line.strip()]
        return lines[-1].strip()[:300] if lines else ""

    def kill(self) -> None:
        """End the driver (its actors, and the trials in them, end with it)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.channel.close()

    def close(self) -> None:
        self.channel.close()  # the driver ends when its end closes
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw.decode("utf-8", "replace"))

    def _read(self) -> None:
        try:
            while (message := self.channel.receive()) is not None:
                if message["op"] == "done":
                    self._on_done(message)
                elif message["op"] == "nodes":
                    with self._lock:
                        asked = self._asks.get(message.get("seq", -1))
                    if asked is not None and not asked.done():
                        asked.set_result(message)
        except WireError:
            self.kill()
        finally:
            self.gone.set()
            with self._lock:
                asks = list(self._asks.values())
            for asked in asks:
                if not asked.done():
                    asked.set_result({"error": "the Ray driver has gone"})
            self._on_gone(self)
