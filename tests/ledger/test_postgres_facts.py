"""PostgreSQL facts the ledger relies on, each checked against the real server.

* the schema is created once (``holedger init``); writers open with create_tables off
  and several of them can start at once;
* every ledger connection has a lock_timeout (SHOW lock_timeout);
* inserts go through eventsourcing-sqlalchemy's table-locking path, never through
  eventsourcing's POSTGRES_ENABLE_DB_FUNCTIONS insert functions;
* global notification ids may have gaps (rolled-back inserts, sequence jumps) and
  nothing treats a gap as a deletion: runs still verify.
"""

from __future__ import annotations

import itertools
import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from eventsourcing_sqlalchemy.recorders import SQLAlchemyApplicationRecorder
from pgdb import fresh_database
from sqlalchemy import text

from holedger.cli import cli
from holedger.errors import ConfigError, LedgerConflictError
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run

from .recorded_run import open_run
from .workers import KEY_NAME, gateway_call, open_writer

pytestmark = pytest.mark.postgres


@pytest.fixture()
def empty_db(pg_url: str) -> Iterator[str]:
    """A brand-new, empty database (the session one already has tables)."""
    yield from fresh_database("holedger_empty")


def _open_and_append(url: str, seed: bytes, run_id: str, tag: str) -> None:
    ledger = open_writer(url, seed)
    for n in range(10):
        while True:
            try:
                ledger.append(run_id, "GatewayCall", gateway_call(f"{tag}-{n}"), "gateway")
                break
            except LedgerConflictError:
                continue
    ledger.close()


def test_init_creates_the_schema_once_and_writers_start_together(
    empty_db: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="no holedger tables") as info:
        Ledger.open(empty_db, SigningKey.generate(KEY_NAME), create_tables=False)
    assert "holedger init" in info.value.one_line()
    home = tmp_path / "home"
    result = CliRunner().invoke(cli, ["--home", str(home), "--ledger", empty_db, "init", "--json"])
    assert result.exit_code == 0, result.output
    key = SigningKey.load(home / "keys" / "operator.key")
    setup = Ledger.open(empty_db, key, create_tables=False)
    run_id = open_run(setup)
    setup.close()
    ctx = multiprocessing.get_context("fork")
    writers = [
        ctx.Process(target=_open_and_append, args=(empty_db, key.seed(), run_id, f"w{i}"))
        for i in range(4)
    ]
    for proc in writers:
        proc.start()
    for proc in writers:
        proc.join(timeout=120)
    assert [p.exitcode for p in writers] == [0, 0, 0, 0]
    reader = Ledger.open(empty_db, None, create_tables=False)
    try:
        assert sum(1 for r in reader.records(run_id) if r.type == "GatewayCall") == 40
    finally:
        reader.close()


def test_every_ledger_connection_has_a_lock_timeout(pg_url: str) -> None:
    ledger = Ledger.open(pg_url, SigningKey.generate(KEY_NAME))
    try:
        with ledger.app.engine.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "30s"
        # The recorder's own sessions (where LOCK TABLE runs) use the same engine.
        with ledger.app.recorder.transaction(commit=False) as session:
            assert session.execute(text("SHOW lock_timeout")).scalar() == "30s"
    finally:
        ledger.close()


def test_inserts_never_use_eventsourcing_db_functions(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger.open(pg_url, SigningKey.generate(KEY_NAME))
    recorder = ledger.app.recorder
    locks: list[object] = []
    lock_table = recorder._lock_table  # type: ignore[attr-defined]
    monkeypatch.setattr(recorder, "_lock_table", lambda s: (locks.append(s), lock_table(s)))
    try:
        run_id = open_run(ledger)
        ledger.append(run_id, "GatewayCall", gateway_call("x"), "gateway")
        assert "POSTGRES_ENABLE_DB_FUNCTIONS" not in ledger.app.env
        # eventsourcing-sqlalchemy's recorder (holedger's subclass), which locks the table
        # before every insert: the DB-functions path would skip that lock.
        assert isinstance(recorder, SQLAlchemyApplicationRecorder)
        assert len(locks) == 2  # RunOpened, then the GatewayCall
        with ledger.app.engine.connect() as conn:
            functions = conn.execute(
                text("SELECT count(*) FROM pg_proc WHERE proname LIKE 'es_insert_events%'")
            ).scalar()
        assert functions == 0
    finally:
        ledger.close()


def _global_ids(ledger: Ledger, run_id: str) -> list[int]:
    with ledger.app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id FROM holedger_events WHERE originator_id = :rid "
                "ORDER BY originator_version"
            ),
            {"rid": uuid.UUID(run_id)},
        )
        return [int(row[0]) for row in rows]


def test_global_id_gaps_are_not_deletions(pg_url: str) -> None:
    key = SigningKey.generate(KEY_NAME)
    first = Ledger.open(pg_url, key, checkpoint_interval=8)
    second = Ledger.open(pg_url, key, checkpoint_interval=8, create_tables=False)
    try:
        run_id = open_run(first)
        for n in range(5):
            first.append(run_id, "GatewayCall", gateway_call(f"a{n}"), "gateway")
        # A stale writer's insert is rolled back: its sequence values are gone for good.
        second.append(run_id, "GatewayCall", gateway_call("stale-head"), "gateway")
        with pytest.raises(LedgerConflictError):
            first.append(run_id, "GatewayCall", gateway_call("loser"), "gateway")
        # And the sequence can jump for any other reason (another table's traffic, a DBA).
        with first.app.engine.begin() as conn:
            conn.execute(
                text(
                    "SELECT setval(pg_get_serial_sequence('holedger_events', 'id'), "
                    "(SELECT max(id) FROM holedger_events) + 1000)"
                )
            )
        for n in range(5):
            first.append(run_id, "GatewayCall", gateway_call(f"b{n}"), "gateway")
        first.close_run(run_id)
        ids = _global_ids(first, run_id)
        gaps = [b - a for a, b in itertools.pairwise(ids) if b - a > 1]
        assert gaps and max(gaps) > 1000
        report = replay_run(first, run_id, checks=())
        assert report.verified, report.failures[:3]
        assert [r.seq for r in first.records(run_id)] == list(range(len(ids)))
    finally:
        first.close()
        second.close()
