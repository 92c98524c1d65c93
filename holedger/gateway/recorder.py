"""The gateway's event writer: one thread appends GatewayCall events in submission order.

Calls are answered without waiting for the database; the writer keeps the order in which
events were submitted (per run), groups what is waiting into one atomic batch per run, and
retries on a conflict with another writer of the same run. If writing fails, the gateway
stops forwarding (it fails closed) until the writer recovers.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from pydantic import BaseModel

from holedger.errors import LedgerConflictError
from holedger.ledger.store import Ledger
from holedger.schemas.types import Role

log = logging.getLogger("holedger.gateway")
MAX_BATCH = 256


Events = list[tuple[str, BaseModel, Role]]


@dataclass
class Submission:
    """Events (and the blobs they refer to) for one run; ``build``, when given, makes more
    of them on the writer thread, so the caller only hands over a snapshot."""

    run_id: str
    events: Events = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)
    build: Callable[[], tuple[Events, list[bytes]]] | None = None


_FLUSH = "flush"
_STOP = "stop"


class EventWriter:
    """Appends submitted events in order, in batches.

    After the first waiting item the writer lingers up to ``linger_s`` for more, so a
    batch becomes one blob transaction and one append per run (appending is the costly
    part; batching keeps it off the gateway's latency). ``flush`` cuts the linger short.
    """

    def __init__(self, ledger: Ledger, *, linger_s: float = 0.05) -> None:
        self.ledger = ledger
        self.linger_s = linger_s
        self._queue: queue.Queue[Submission | str] = queue.Queue()
        self._cond = threading.Condition()
        self._submitted = 0
        self._done = 0
        self.failure: str | None = None
        self._abandon = False
        self._thread = threading.Thread(target=self._run, name="holedger-gateway-writer")
        self._thread.daemon = True
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The writer thread's operating-system id (to read its CPU time)."""
        return self._thread.native_id

    def submit(self, item: Submission) -> None:
        with self._cond:
            self._submitted += 1
        self._queue.put(item)

    @property
    def backlog(self) -> int:
        """Submissions not yet written (in memory: lost if the process dies)."""
        return self._submitted - self._done

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        with self._cond:
            target = self._submitted
            if self._done >= target:
                return True
        self._queue.put(_FLUSH)
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= target, timeout=timeout)

    def close(self, timeout: float = 30.0) -> None:
        if not self.flush(timeout):
            self._abandon = True  # shutting down while the ledger is unwritable
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch, stop = self._collect()
            if batch:
                self._write(batch)
                with self._cond:
                    self._done += len(batch)
                    self._cond.notify_all()
            if stop:
                return

    def _collect(self) -> tuple[list[Submission], bool]:
        """The next batch, and whether the writer should stop after writing it."""
        first = self._queue.get()
        if isinstance(first, str):
            return [], first == _STOP
        batch = [first]
        deadline = time.monotonic() + self.linger_s
        while len(batch) < MAX_BATCH:
            wait = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, str):
                if item == _STOP:
                    return batch, True
                # a flush: write what is waiting now, without lingering
                while len(batch) < MAX_BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(more, str):
                        if more == _STOP:
                            return batch, True
                        continue
                    batch.append(more)
                break
            batch.append(item)
        return batch, False

    def _write(self, batch: list[Submission]) -> None:
        # Blobs first: an event never refers to a blob that is not yet stored.
        by_run: dict[str, Events] = {}
        blobs: list[bytes] = []

        def gather() -> None:
            by_run.clear()
            blobs.clear()
            for item in batch:
                events = by_run.setdefault(item.run_id, [])
                events += item.events
                blobs.extend(item.blobs)
                if item.build is not None:
                    more_events, more_blobs = item.build()
                    events += more_events
                    blobs.extend(more_blobs)

        self._retrying(gather, recovers=False)  # failing here is a bug: the gateway fails closed
        unique = list(dict.fromkeys(blobs))
        if not by_run and unique:
            self._retrying(partial(self.ledger.put_blobs, unique))
        # The blobs go into the first run's transaction, with its events and before them;
        # any other run's events are written after that transaction has committed.
        for index, (run_id, events) in enumerate(by_run.items()):
            with_blobs = unique if index == 0 else []
            self._retrying(partial(self.ledger.append_many, run_id, events, blobs=with_blobs))

    def _retrying(self, action: Callable[[], object], *, recovers: bool = True) -> None:
        """Run ``action`` until it succeeds: audit events are never dropped. While it
        fails, ``failure`` is set and the gateway refuses new calls (it fails closed); a
        success clears it when ``recovers`` (the ledger took a write)."""
        attempt = 0
        while not self._abandon:
            try:
                action()
                if recovers:
                    self.failure = None
                return
            except LedgerConflictError:
                time.sleep(0.001 * min(attempt + 1, 50))  # another writer of the run: retry
            except Exception as exc:  # keep the thread alive; the gateway fails closed
                if self.failure is None:
                    log.error("gateway event write failed: %s: %s", type(exc).__name__, exc)
                self.failure = f"{type(exc).__name__}: {exc}"
                time.sleep(min(1.0, 0.05 * (attempt + 1)))
            attempt += 1
        log.error("gateway event writer stopped with events unwritten: %s", self.failure)
