"""The gateway's side of a run's close: refuse its calls, finish those in flight.

:class:`RunGate` counts each run's calls in flight (any scope). The ledger's close hook
(:meth:`RunGate.close`, run by ``Ledger.close_run`` before RunClosed is appended) shuts
the run's gate: from then on every call of the run is refused 403 ``run_closed`` and
records nothing; the hook then waits for the calls already in flight, so their events
are handed to the writer, and the gateway flushes the writer. Each call of the run is
therefore recorded before RunClosed, or (one still running when the wait ends, or one
seen by a gateway of another process) not at all: the ledger refuses events after
RunClosed.
"""

from __future__ import annotations

import threading
from collections import Counter

# How long a close waits for the run's calls in flight (a long stream may outlast it:
# its event is then not recorded).
CLOSE_WAIT_S = 30.0
RUN_CLOSED_CODE = "run_closed"


def run_closed_message(run_id: str) -> str:
    return f"run {run_id} is closed: its tokens died with it; open a new run for more calls"


class RunGate:
    """Closed runs, and each open run's calls in flight; safe from any thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed: set[str] = set()
        self._in_flight: Counter[str] = Counter()

    def is_closed(self, run_id: str) -> bool:
        return run_id in self._closed

    def enter(self, run_id: str) -> bool:
        """Count a call of ``run_id`` in flight; False (not counted) once it has closed."""
        with self._cond:
            if run_id in self._closed:
                return False
            self._in_flight[run_id] += 1
            return True

    def leave(self, run_id: str) -> None:
        with self._cond:
            self._in_flight[run_id] -= 1
            if self._in_flight[run_id] <= 0:
                del self._in_flight[run_id]
                self._cond.notify_all()

    def shut(self, run_id: str) -> None:
        """Refuse the run's calls from now on."""
        with self._cond:
            self._closed.add(run_id)

    def wait_idle(self, run_id: str, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Wait until none of the run's calls is in flight; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: run_id not in self._in_flight, timeout_s)

    def in_flight(self, run_id: str) -> int:
        with self._cond:
            return self._in_flight.get(run_id, 0)
