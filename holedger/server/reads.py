"""What the optimizer looked at: its API reads, recorded as signed OptimizerRead events.

A read is queued when the server has answered it (:meth:`ReadRecorder.record`, never
blocking the request on the ledger) and written by one writer thread in batches: every
``interval_s`` seconds, or as soon as a run has ``batch`` reads waiting. Closing a run
flushes its reads first (a ledger close hook), so every read answered before the close
began is recorded before RunClosed. A read answered while its run is closing, after that
flush, is refused by the ledger (nothing follows RunClosed) and left unrecorded, logged:
a record can be missing in that window, never wrong. Each read carries ``after_seq``, the
last event of the state it was answered from; replay (``reads_disclosed``) checks that
what it returned had been disclosed by then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from holedger.errors import HoledgerError, LedgerConflictError, RunClosedError
from holedger.ledger.records import utc_now
from holedger.ledger.store import Ledger
from holedger.schemas.events import OptimizerRead, ReadItem
from holedger.server.state import RunState

log = logging.getLogger("holedger.server.reads")
BATCH = 256  # reads per OptimizerRead event at most
INTERVAL_S = 0.5
APPEND_ATTEMPTS = 50


def read_item(state: RunState, kind: str, **fields: object) -> ReadItem:
    """The record of a read answered from ``state``."""
    return ReadItem.model_validate(
        {"kind": kind, "after_seq": max(state.next_seq - 1, 0), "time": utc_now(), **fields}
    )


class ReadRecorder:
    """Queues reads per run and writes them off the request path (one daemon thread)."""

    def __init__(self, ledger: Ledger, *, batch: int = BATCH, interval_s: float = INTERVAL_S):
        self.ledger = ledger
        self.batch = batch
        self.interval_s = interval_s
        self._pending: dict[str, list[ReadItem]] = {}
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()  # held while a batch is between queue and ledger
        self._stopping = False
        self._hook: Callable[[str], None] = self.flush_run
        ledger.close_hooks.append(self._hook)
        self._thread = threading.Thread(target=self._loop, name="holedger-reads", daemon=True)
        self._thread.start()

    def record(self, run_id: str, item: ReadItem) -> None:
        with self._cond:
            queue = self._pending.setdefault(run_id, [])
            queue.append(item)
            if len(queue) >= self.batch:
                self._cond.notify()

    def pending(self, run_id: str) -> int:
        with self._cond:
            return len(self._pending.get(run_id, []))

    def flush_run(self, run_id: str) -> None:
        """Write the run's queued reads now (a close hook: before RunClosed)."""
        with self._write_lock:
            with self._cond:
                items = self._pending.pop(run_id, [])
            self._write(run_id, items)

    def flush(self) -> None:
        """Write every queued read now."""
        with self._write_lock:
            with self._cond:
                taken, self._pending = self._pending, {}
            for run_id, items in taken.items():
                self._write(run_id, items)

    def close(self) -> None:
        """Write what is queued, stop the writer thread and leave the ledger's hooks."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=30)
        self.flush()
        if self._hook in self.ledger.close_hooks:
            self.ledger.close_hooks.remove(self._hook)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._stopping:
                    self._cond.wait(self.interval_s)
                if self._stopping:
                    return
            try:
                self.flush()
            except Exception:  # never kill the writer: the next flush tries again
                log.exception("recording the optimizer's reads failed")

    def _write(self, run_id: str, items: list[ReadItem]) -> None:
        for start in range(0, len(items), self.batch):
            event = OptimizerRead(reads=items[start : start + self.batch])
            try:
                self._append(run_id, event)
            except RunClosedError:
                log.warning(
                    "run %s closed before %d of its optimizer's reads were recorded",
                    run_id,
                    len(items) - start,
                )
                return
            except HoledgerError as exc:
                log.error("optimizer reads of run %s not recorded: %s", run_id, exc.message)
                return

    def _append(self, run_id: str, event: OptimizerRead) -> None:
        for _ in range(APPEND_ATTEMPTS):
            try:
                self.ledger.append_many(run_id, [("OptimizerRead", event, "server")])
                return
            except LedgerConflictError:
                continue
        raise LedgerConflictError(f"run {run_id} is too busy to record reads")
