"""Several writer processes at once: no event lost, no fork, every run verifies.

* 4 processes append to 4 different runs (single-event transactions) on SQLite and on
  PostgreSQL: each run holds exactly what its writer was told was stored.
* 2 processes race on one run: every append either lands or raises LedgerConflictError
  and is retried above the aggregate; the run stays one contiguous, verifying chain.
* A commit that fails with a SQLite lock error raises; it is never passed over.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import sqlite3
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc
from eventsourcing.persistence import IntegrityError, PersistenceError, StoredEvent
from sqlalchemy.orm import Session

from holedger.errors import LedgerConflictError
from holedger.ledger.keys import SigningKey
from holedger.ledger.sql import HoledgerApplicationRecorder
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

from .recorded_run import open_run
from .workers import KEY_NAME, append_n, gateway_call

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
PER_WRITER = 60


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture()
def key() -> SigningKey:
    return SigningKey.generate(KEY_NAME)


def _run_writers(targets: list[tuple[Any, ...]]) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=append_n, args=args) for args in targets]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def _call_ids(ledger: Ledger, run_id: str) -> Counter[str]:
    return Counter(
        str(rec.payload["call_id"]) for rec in ledger.records(run_id) if rec.type == "GatewayCall"
    )


def _open_runs(url: str, key: SigningKey, count: int) -> list[str]:
    ledger = Ledger.open(url, key, checkpoint_interval=16)  # creates the schema, once
    try:
        return [open_run(ledger, f"concurrent-{i}") for i in range(count)]
    finally:
        ledger.close()  # no connection of the parent is inherited by the writers


def test_four_processes_on_four_runs_lose_nothing(url: str, key: SigningKey) -> None:
    runs = _open_runs(url, key, 4)
    _run_writers([(url, key.seed(), run_id, f"w{i}", PER_WRITER) for i, run_id in enumerate(runs)])
    ledger = Ledger.open(url, key, checkpoint_interval=16, create_tables=False)
    try:
        for i, run_id in enumerate(runs):
            ids = _call_ids(ledger, run_id)
            assert ids == Counter(f"w{i}-{n}" for n in range(PER_WRITER))
            ledger.close_run(run_id)
            report = replay_run(ledger, run_id, checks=())
            assert report.verified, report.failures[:3]
    finally:
        ledger.close()


def test_two_processes_racing_on_one_run_never_fork(url: str, key: SigningKey) -> None:
    (run_id,) = _open_runs(url, key, 1)
    _run_writers([(url, key.seed(), run_id, tag, PER_WRITER) for tag in ("a", "b")])
    ledger = Ledger.open(url, key, checkpoint_interval=16, create_tables=False)
    try:
        ids = _call_ids(ledger, run_id)
        expected = Counter(f"{tag}-{n}" for tag in "ab" for n in range(PER_WRITER))
        assert ids == expected  # both finished, each event exactly once
        seqs = [rec.seq for rec in ledger.records(run_id)]
        assert seqs == list(range(len(seqs)))
        ledger.close_run(run_id)
        report = replay_run(ledger, run_id, checks=())
        assert report.verified, report.failures[:3]
    finally:
        ledger.close()


def fail_next_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next COMMIT fail as SQLite does when another process holds the lock.

    The error is shaped the way eventsourcing-sqlalchemy 1.0.1 tests for before passing
    over it (its first argument a sqlite3.OperationalError).
    """
    calls: list[int] = []
    real_commit = Session.commit

    def commit(self: Session) -> None:
        if not calls:
            calls.append(1)
            self.rollback()
            locked = sqlite3.OperationalError("database is locked")
            error = sqlalchemy.exc.OperationalError("COMMIT", {}, locked)
            error.args = (locked,)
            raise error
        real_commit(self)

    monkeypatch.setattr(Session, "commit", commit)


def test_a_failed_commit_raises_and_is_not_stored(
    tmp_path: Path, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventsourcing.persistence import OperationalError

    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", key, checkpoint_interval=16)
    run_id = open_run(ledger)
    with monkeypatch.context() as patch:
        fail_next_commit(patch)
        with pytest.raises(OperationalError, match="locked"):
            ledger.append(run_id, "GatewayCall", gateway_call("lost?"), "gateway")
    assert [r.type for r in ledger.records(run_id)] == ["RunOpened"]  # nothing half-stored
    ledger.append(run_id, "GatewayCall", gateway_call("after"), "gateway")  # appending goes on
    ledger.close_run(run_id)
    assert replay_run(ledger, run_id, checks=()).verified
    ledger.close()


def test_the_recorder_keeps_order_ids_and_stream_positions(
    url: str, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """holedger's recorder (one multi-row INSERT per batch) keeps the stock recorder's
    contract: notification ids in batch order, a taken stream position refused with
    IntegrityError and nothing of that batch kept; and it falls back to the stock insert
    where the driver cannot return ids in parameter order."""
    ledger = Ledger.open(url, key)
    recorder = ledger.app.recorder
    assert isinstance(recorder, HoledgerApplicationRecorder)
    stream = uuid.uuid4()

    def event(version: int, state: bytes) -> StoredEvent:
        return StoredEvent(originator_id=stream, originator_version=version, topic="T", state=state)

    ids = recorder.insert_events([event(v, b"s%d" % v) for v in (1, 2, 3)])
    assert ids is not None and list(ids) == sorted(ids) and len(set(ids)) == 3
    notes = recorder.select_notifications(start=ids[0], limit=10)
    assert [(n.id, n.originator_version, n.state) for n in notes] == [
        (ids[0], 1, b"s1"),
        (ids[1], 2, b"s2"),
        (ids[2], 3, b"s3"),
    ]
    with pytest.raises(IntegrityError):
        recorder.insert_events([event(4, b"s4"), event(3, b"again")])
    assert [e.originator_version for e in recorder.select_events(stream)] == [1, 2, 3]

    monkeypatch.setattr(
        ledger.app.engine.dialect, "insert_executemany_returning_sort_by_parameter_order", False
    )
    more = recorder.insert_events([event(4, b"s4"), event(5, b"s5")])
    assert more is not None and len(more) == 2 and min(more) > max(ids)
    assert [e.state for e in recorder.select_events(stream)] == [b"s1", b"s2", b"s3", b"s4", b"s5"]
    ledger.close()


def test_blobs_are_stored_in_the_events_transaction(url: str, key: SigningKey) -> None:
    """Blobs handed to append_many commit with its events or not at all: a writer that
    loses a race stores neither, and its retry stores both."""
    first = Ledger.open(url, key)
    second = Ledger.open(url, key, create_tables=False)
    run_id = open_run(first)
    first.append(run_id, "GatewayCall", gateway_call("warm"), "gateway")  # caches the head
    second.append(run_id, "GatewayCall", gateway_call("other"), "gateway")  # moves it
    body = b"a request body only the losing batch carries"
    digest = hashlib.sha256(body).hexdigest()
    call = dict(gateway_call("loser"), request_digest=digest)
    with pytest.raises(LedgerConflictError):
        first.append_many(run_id, [("GatewayCall", call, "gateway")], blobs=[body])
    assert not first.has_blob(digest)
    first.append_many(run_id, [("GatewayCall", call, "gateway")], blobs=[body, body])
    assert first.get_blob(digest) == body
    first.append_many(run_id, [], blobs=[b"alone"])  # no events: the blobs still land
    assert first.has_blob(hashlib.sha256(b"alone").hexdigest())
    first.close_run(run_id)
    report = replay_run(first, run_id, checks=())  # integrity: every blob is present
    assert report.verified, report.failures
    first.close()
    second.close()


def test_a_failing_blob_insert_raises_eventsourcing_errors(url: str, key: SigningKey) -> None:
    """Blobs go through the driver's executemany, but a failure still surfaces as an
    eventsourcing persistence error (which callers handle), never as a raw driver error."""
    ledger = Ledger.open(url, key)
    bad = [{"digest": "ab" * 32, "size": None, "data": b"x"}]  # size is NOT NULL
    with pytest.raises(PersistenceError):
        ledger.app.recorder.insert_events([], blobs=bad)
    assert not ledger.has_blob("ab" * 32)
    ledger.close()
