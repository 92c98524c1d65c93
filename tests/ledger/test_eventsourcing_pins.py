"""The private parts of eventsourcing(-sqlalchemy) the ledger's SQL store still relies on,
pinned by the digest of their source: a release that changes any of them fails here, so
holedger.ledger.sql is read again against it before the pin is moved.

Each pin names the line of holedger/ledger/sql.py that depends on it and why.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from eventsourcing_sqlalchemy.datastore import Transaction
from eventsourcing_sqlalchemy.factory import SQLAlchemyFactory
from eventsourcing_sqlalchemy.recorders import SQLAlchemyApplicationRecorder

from holedger.ledger.sql import HoledgerApplicationRecorder, HoledgerSQLAlchemyFactory

Recorder = SQLAlchemyApplicationRecorder

PINS: dict[str, tuple[Callable[..., Any], str]] = {
    # insert_events hands its keyword arguments to _insert_events and
    # _insert_stored_events in one transaction: the blobs ride on them.
    "insert_events": (Recorder.insert_events, "c8104851f898d9e9"),
    # overridden to store the batch's blobs first, in the events' transaction
    "_insert_events": (Recorder._insert_events, "12f4ee3249472238"),
    # overridden with one multi-row INSERT; must return the same notification ids
    "_insert_stored_events": (Recorder._insert_stored_events, "42c7da661c7ae91f"),
    # called as the stock recorder calls them, before and after the insert
    "_lock_table": (Recorder._lock_table, "1163a0dac29d9347"),
    "_notify_channel": (Recorder._notify_channel, "2d753588cd10fb92"),
    # replaced by HoledgerSQLAlchemyFactory.__init__ (engine settings of its own)
    "SQLAlchemyFactory.__init__": (SQLAlchemyFactory.__init__, "761b11f704858475"),
    # why the factory clears the datastore's write_lock (a failed COMMIT passed over)
    "Transaction.__exit__": (Transaction.__exit__, "14accce567b15486"),
}


@pytest.mark.parametrize("name", sorted(PINS))
def test_the_private_eventsourcing_code_the_store_relies_on_is_unchanged(name: str) -> None:
    function, digest = PINS[name]
    got = hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    assert got == digest, f"{name} changed in this eventsourcing release: re-read ledger/sql.py"


def test_the_store_overrides_only_what_is_pinned() -> None:
    own = {
        name
        for name, value in vars(HoledgerApplicationRecorder).items()
        if callable(value) and name.startswith("_") and not name.startswith("__")
    }
    assert own <= set(PINS), own - set(PINS)
    assert HoledgerSQLAlchemyFactory.application_recorder_class is HoledgerApplicationRecorder
    # the attribute the multi-row insert reads to decide whether to lock the table
    assert "_has_autoincrementing_ids" in vars(Recorder) or any(
        "_has_autoincrementing_ids" in inspect.getsource(c.__init__)
        for c in Recorder.__mro__
        if "__init__" in vars(c) and c.__module__.startswith("eventsourcing")
    )
