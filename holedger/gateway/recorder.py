"""The gateway's event writer: one thread appends GatewayCall events in submission order.

Calls are answered without waiting for the database; the writer keeps the order in which
events were submitted (per run), groups what is waiting into one atomic batch per run, and
retries on a conflict with another writer of the same run. If writing fails, the gateway
stops forwarding (it fails closed) until the writer recovers.

:class:`EventRoom` bounds what a crash could lose: a call is forwarded only while fewer
than ``limit`` forwarded calls have events not yet written; beyond that it waits, on its
own event loop, until the writer has caught up.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from pydantic import BaseModel, ValidationError

from holedger.errors import (
    CanonicalError,
    LedgerConflictError,
    RunClosedError,
    SchemaError,
    UsageError,
)
from holedger.ledger.store import Ledger
from holedger.schemas.types import Role

log = logging.getLogger("holedger.gateway")
MAX_BATCH = 256
# What the ledger raises for events it can never write (not a failure of the ledger).
_REFUSED = (CanonicalError, SchemaError, UsageError, ValidationError, ValueError, TypeError)


Events = list[tuple[str, BaseModel, Role]]


@dataclass
class Submission:
    """Events (and the blobs they refer to) for one run; ``build``, when given, makes more
    of them on the writer thread, so the caller only hands over a snapshot."""

    run_id: str
    events: Events = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)
    build: Callable[[], tuple[Events, list[bytes]]] | None = None
    # Events recording the call as refused, when its own events cannot be built or
    # written (given the reason): the writer goes on either way.
    fallback: Callable[[str], Events] | None = None


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
        # Called on the writer thread when submissions have been written, and when
        # writing starts failing (so whoever waits for room can look again).
        self.on_progress: Callable[[], None] | None = None
        self._abandon = False
        self.lost = 0  # submissions given up unwritten (only when closing while failing)
        self.unbuildable = 0  # submissions replaced by their fallback
        self.dropped_closed = 0  # groups dropped because their run had closed
        # Called on the writer thread with a run the ledger refused as closed.
        self.on_closed: Callable[[str], None] | None = None
        self._thread = threading.Thread(target=self._run, name="holedger-gateway-writer")
        self._thread.daemon = True
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The writer thread's operating-system id (to read its CPU time)."""
        return self._thread.native_id

    def submit(self, item: Submission) -> int:
        """Queue ``item``; returns its number. Items are written in this order, so item
        ``n`` is written once ``written >= n``."""
        with self._cond:  # numbered and queued in one step: queue order is number order
            self._submitted += 1
            self._queue.put(item)
            return self._submitted

    @property
    def written(self) -> int:
        """How many submissions have been written (the first ``written`` numbers)."""
        return self._done

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
        if self._abandon or not self._thread.is_alive():
            return False  # closed with events unwritten: nobody will write them now
        self._queue.put(_FLUSH)
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= target, timeout=timeout)

    def close(self, timeout: float = 30.0) -> None:
        # A writer that cannot write now is not waited for: shutting down must not hang
        # on a broken ledger (what is lost is logged, and counted in ``lost``).
        if self.failure is not None or not self.flush(timeout):
            self._abandon = True  # shutting down while the ledger is unwritable
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch, stop = self._collect()
            if batch and self._write(batch):
                with self._cond:
                    self._done += len(batch)
                    self._cond.notify_all()
                self._progress()
            elif batch:  # abandoned at shutdown: unwritten, so never counted as written
                self.lost += len(batch)
            if stop:
                return

    def _progress(self) -> None:
        hook = self.on_progress
        if hook is not None:
            try:
                hook()
            except Exception:  # a waiter's trouble must not stop the writer
                log.exception("gateway event writer: progress hook failed")

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

    def _write(self, batch: list[Submission]) -> bool:
        """Write ``batch``; False if it was given up (closing while the ledger fails).

        Each submission is built on its own: one whose events cannot be built is replaced
        by its ``fallback`` (see :class:`Submission`), and the others are written. A run's
        group the ledger refuses as such (an event it cannot encode) is written one
        submission at a time, so only the bad one is replaced; a closed run's events are
        dropped (nothing follows RunClosed). Neither stops the writer.
        """
        by_run: dict[str, list[tuple[Submission, Events, list[bytes]]]] = {}
        for item in batch:
            events, blobs = self._build(item)
            by_run.setdefault(item.run_id, []).append((item, events, blobs))
        # Blobs first: an event never refers to a blob that is not yet stored. They go
        # into the first run's transaction, with its events and before them; any other
        # run's events are written after that transaction has committed.
        unique = list(
            dict.fromkeys(b for group in by_run.values() for _, _, bs in group for b in bs)
        )
        if not by_run and unique:
            return self._retrying(partial(self.ledger.put_blobs, unique)) != "abandoned"
        written = True
        pending_blobs = unique
        for run_id, group in by_run.items():
            events = [event for _, evs, _ in group for event in evs]
            outcome = self._append(run_id, events, pending_blobs)
            if outcome == "refused":
                outcome = self._append_one_by_one(run_id, group, pending_blobs)
            if outcome == "written":
                pending_blobs = []
            elif outcome == "closed" and self.on_closed is not None:
                self.on_closed(run_id)
            written = outcome != "abandoned" and written
        return written

    def _build(self, item: Submission) -> tuple[Events, list[bytes]]:
        events, blobs = list(item.events), list(item.blobs)
        if item.build is None:
            return events, blobs
        try:
            more_events, more_blobs = item.build()
        except Exception as exc:  # one call's event, not the writer: replace it
            log.error("gateway event could not be built: %s: %s", type(exc).__name__, exc)
            self.unbuildable += 1
            return self._fallback(item, exc)
        return events + more_events, blobs + more_blobs

    def _fallback(self, item: Submission, exc: Exception) -> tuple[Events, list[bytes]]:
        if item.fallback is None:
            return [], []
        try:
            return item.fallback(f"{type(exc).__name__}: {exc}"[:200]), []
        except Exception:
            log.exception("gateway event writer: the fallback event failed too")
            return [], []

    def _append(self, run_id: str, events: Events, blobs: list[bytes]) -> str:
        """ "written", "closed" (dropped), "refused" (the ledger refused the events as
        such) or "abandoned" (closing while the ledger fails)."""
        if not events:  # every event of the group was dropped: keep its blobs anyway
            if not blobs:
                return "written"
            return self._retrying(partial(self.ledger.put_blobs, blobs))
        append = partial(self.ledger.append_many, run_id, events, blobs=blobs)
        return self._retrying(append)

    def _append_one_by_one(
        self,
        run_id: str,
        group: list[tuple[Submission, Events, list[bytes]]],
        blobs: list[bytes],
    ) -> str:
        result = "written"
        for item, events, _ in group:
            outcome = self._append(run_id, events, blobs)
            if outcome == "refused":
                self.unbuildable += 1
                log.error("gateway event of run %s refused by the ledger: replaced", run_id)
                fallback, _ = self._fallback(item, ValueError("the ledger refused the event"))
                outcome = self._append(run_id, fallback, blobs) if fallback else "written"
                if outcome == "refused":
                    outcome = "written"  # nothing more can be done for this one call
            if outcome == "written":
                blobs = []
            elif outcome == "abandoned":
                return outcome
            else:
                result = outcome
        return result

    def _retrying(self, action: Callable[[], object]) -> str:
        """Run ``action`` until it succeeds: audit events are never dropped. While it
        fails, ``failure`` is set and the gateway refuses new calls (it fails closed); a
        success clears it. Returns "written"; "closed" when the run has closed (its
        events are dropped: nothing follows RunClosed); "refused" when the ledger refuses
        the events themselves (retrying could never succeed); "abandoned" only when given
        up, at shutdown."""
        attempt = 0
        while not self._abandon:
            try:
                action()
                self.failure = None
                return "written"
            except LedgerConflictError:
                time.sleep(0.001 * min(attempt + 1, 50))  # another writer of the run: retry
            except RunClosedError as exc:
                self.dropped_closed += 1
                log.warning("gateway events dropped: %s", exc)
                return "closed"
            except _REFUSED as exc:
                log.error("gateway event refused: %s: %s", type(exc).__name__, exc)
                return "refused"
            except Exception as exc:  # keep the thread alive; the gateway fails closed
                first = self.failure is None
                if first:
                    log.error("gateway event write failed: %s: %s", type(exc).__name__, exc)
                self.failure = f"{type(exc).__name__}: {exc}"
                if first:
                    self._progress()  # calls waiting for room now fail closed
                time.sleep(min(1.0, 0.05 * (attempt + 1)))
            attempt += 1
        log.error("gateway event writer stopped with events unwritten: %s", self.failure)
        return "abandoned"


class EventRoom:
    """At most ``limit`` forwarded calls whose events are not yet written.

    A call asks for room (:meth:`try_admit`, then :meth:`admit`) once it is counted in
    flight and every refusal of its own is decided, before it is forwarded. It holds the
    room while it is forwarded and until its event is written: :meth:`submit` ties the
    room to the event's number in the writer's order, and the room comes free once the
    writer has written that far. A call refused after it took room (``submit`` with
    ``forwarded=False``) frees it at once, and one that ends without an event gives it
    back with :meth:`leave`. Events of calls never forwarded take no room. Everything is
    counted under one lock, so the bound holds however many calls arrive at once.

    Waiting calls are served first come, first served: room that comes free (the writer
    wrote, a call left) is handed to the oldest waiters directly, on their own event
    loops; nothing polls, and new arrivals do not pass those already waiting.
    """

    def __init__(self, writer: EventWriter, limit: int) -> None:
        self.writer = writer
        self.limit = limit
        self._lock = threading.Lock()
        self._forwarding = 0  # admitted, event not yet submitted
        self._unwritten: deque[int] = deque()  # numbers of admitted calls' events
        self._waiters: dict[int, _Waiter] = {}  # insertion order is arrival order
        writer.on_progress = self.wake

    def _owed(self) -> int:
        """Under the lock: admitted calls whose events are not written."""
        written = self.writer.written
        unwritten = self._unwritten
        while unwritten and unwritten[0] <= written:
            unwritten.popleft()
        return self._forwarding + len(unwritten)

    @property
    def owed(self) -> int:
        with self._lock:
            return self._owed()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _take_free(self) -> bool:
        """Under the lock: take room if there is some and nobody waits ahead."""
        if not self._waiters and self._owed() < self.limit:
            self._forwarding += 1
            return True
        return False

    def try_admit(self) -> bool:
        """Take room if there is some now and nobody waits (the common case)."""
        with self._lock:
            return self.writer.failure is None and self._take_free()

    async def admit(self, timeout_s: float, tag: object = None) -> str | None:
        """Wait for room, in arrival order: None once admitted, else why not ("failed"
        when the writer could not write, "withdrawn" by :meth:`withdraw` of ``tag``,
        "timeout" after ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop, loop.create_future(), tag)
        with self._lock:
            if self.writer.failure is not None:
                return "failed"
            if self._take_free():
                return None
            self._waiters[id(waiter)] = waiter
        try:
            await asyncio.wait({waiter.future}, timeout=timeout_s)
        except BaseException:  # cancelled (the client left): room handed over goes back
            if self._withdraw(waiter):
                self.leave()
            raise
        if self._withdraw(waiter):
            return None
        return waiter.ended or "timeout"

    def _withdraw(self, waiter: _Waiter) -> bool:
        """Stop waiting; True when room was handed to ``waiter`` meanwhile."""
        with self._lock:
            self._waiters.pop(id(waiter), None)
            return waiter.granted

    def submit(self, item: Submission, *, admitted: bool, forwarded: bool) -> None:
        """Hand ``item`` to the writer. An admitted call's room passes to its event when
        the call was forwarded, and comes free at once when it was not (a refusal)."""
        with self._lock:
            number = self.writer.submit(item)
            if admitted:
                self._forwarding -= 1
                if forwarded:
                    self._unwritten.append(number)
        if admitted and not forwarded:
            try:  # the event is handed on: a waiter's trouble must not fail its call
                self.wake()
            except Exception:
                log.exception("gateway event room: waking a waiter failed")

    def withdraw(self, tag: object) -> None:
        """End the wait of every call waiting under ``tag`` (its trial has ended)."""
        woken: list[_Waiter] = []
        with self._lock:
            for key, waiter in list(self._waiters.items()):
                if waiter.tag == tag:
                    del self._waiters[key]
                    waiter.ended = "withdrawn"
                    woken.append(waiter)
        self._resolve_all(woken)

    def leave(self) -> None:
        """An admitted call ended without submitting an event: its room is free."""
        with self._lock:
            self._forwarding -= 1
        self.wake()

    def wake(self) -> None:
        """Hand free room to the oldest waiters; if the writer has failed, tell them all
        (they fail closed). Safe from any thread."""
        while self._wake_once():
            pass  # room handed to a waiter on a closed loop came back: hand it on

    def _wake_once(self) -> bool:
        woken: list[_Waiter] = []
        with self._lock:
            failed = self.writer.failure is not None
            free = 0 if failed else self.limit - self._owed()
            while self._waiters and (failed or free > 0):
                key = next(iter(self._waiters))
                waiter = self._waiters.pop(key)
                if failed:
                    waiter.ended = "failed"
                else:
                    waiter.granted = True
                    self._forwarding += 1
                    free -= 1
                woken.append(waiter)
        return self._resolve_all(woken)

    def _resolve_all(self, woken: list[_Waiter]) -> bool:
        """Resolve the waiters' futures; True when room granted to one came back."""
        freed = False
        for waiter in woken:
            try:
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future)
            except RuntimeError:  # that loop has closed: its call is gone with it
                if waiter.granted:
                    with self._lock:
                        self._forwarding -= 1
                    freed = True
        return freed


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    tag: object = None
    granted: bool = False  # room was handed to it (it is admitted)
    ended: str | None = None  # or why its wait ended without room: "failed", "withdrawn"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
