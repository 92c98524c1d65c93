"""The SQL store under the ledger: eventsourcing's Application over eventsourcing-sqlalchemy,
with the signing Mapper, the chaining EventStore and a recorder that inserts a batch with
one multi-row INSERT; and the database URLs a ledger may live at.

Each run is one eventsourcing stream (originator id = the run id as a UUID, originator
version = seq + 1). Two public eventsourcing hooks carry the cryptography:

* :class:`SignedRecordMapper` (``Application.construct_mapper``) turns a pending event
  into a stored event whose ``state`` is the signed record bytes, and back; it binds the
  stream columns (originator id, version, topic) to the signed envelope on read.
* :class:`ChainedEventStore` (``Application.construct_event_store``) supplies each batch's
  ``prev_hash`` from the stream head and signs the batch in order.

The recorder and the factory are chosen by factory settings (``PERSISTENCE_MODULE``);
where they override a private method of eventsourcing-sqlalchemy, the line says why and
tests/ledger/test_eventsourcing_pins.py fails on a release that changes that method.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eventsourcing.application import Application
from eventsourcing.persistence import (
    EventStore,
    InfrastructureFactory,
    Mapper,
    StoredEvent,
)
from eventsourcing.utils import Environment
from eventsourcing_sqlalchemy.datastore import SQLAlchemyDatastore
from eventsourcing_sqlalchemy.factory import SQLAlchemyFactory
from eventsourcing_sqlalchemy.recorders import SQLAlchemyApplicationRecorder
from sqlalchemy import Table, insert
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session

from holedger.errors import (
    ConfigError,
    HoledgerError,
    LedgerConflictError,
    UsageError,
    VerificationError,
)
from holedger.ledger.blobs import insert_blobs
from holedger.ledger.failures import storage_error
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import NO_HOME_HINT, SigningKey
from holedger.ledger.records import Record, sign_envelope
from holedger.schemas.types import ZERO_HASH, Role

APP_NAME = "holedger"


def run_uuid(run_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(run_id)
    except ValueError as exc:
        raise UsageError(f"not a run id: {run_id!r}", hint="see 'holedger run list'") from exc


def engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}
    if url.startswith("postgresql"):
        # A writer never waits forever on the table lock the recorder takes.
        return {
            "connect_args": {"options": "-c lock_timeout=30000"},
            "pool_pre_ping": True,
        }
    return {}


class HoledgerApplicationRecorder(SQLAlchemyApplicationRecorder):
    """eventsourcing-sqlalchemy's application recorder, inserting a batch with one
    multi-row INSERT instead of one ORM object per event.

    The same table, the same table lock before the insert (PostgreSQL, so notification
    ids are assigned in commit order), the same unique stream position (a racing writer
    still gets an IntegrityError), the same notification ids returned and the same notify;
    only the ORM unit of work, most of an append's cost outside signing, is skipped.
    """

    # Private hook of eventsourcing-sqlalchemy, overridden because its insert_events hands
    # our keyword arguments (the batch's blobs) to it inside the events' transaction, which
    # no public hook does; pinned by tests/ledger/test_eventsourcing_pins.py.
    def _insert_events(
        self,
        session: Session,
        stored_events: Sequence[StoredEvent],
        *,
        blobs: Sequence[dict[str, Any]] = (),
        **kwargs: Any,
    ) -> None:
        """Store ``blobs`` (rows of the blobs table) in the events' transaction, first."""
        if blobs:
            insert_blobs(session, blobs)

    # Private method, overridden for one multi-row INSERT (the stock one builds an ORM
    # object per event, most of an append's cost outside signing); it still locks the
    # table, returns the notification ids and notifies as the stock one does. Pinned by
    # tests/ledger/test_eventsourcing_pins.py.
    def _insert_stored_events(
        self, session: Session, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int]:
        if not stored_events:
            return []
        if not session.get_bind().dialect.insert_executemany_returning_sort_by_parameter_order:
            return super()._insert_stored_events(session, stored_events, **kwargs)  # old SQLite
        if self._has_autoincrementing_ids:
            self._lock_table(session)
        table: Table = self.events_record_cls.__table__
        rows = [
            {
                "originator_id": e.originator_id,
                "originator_version": e.originator_version,
                "topic": e.topic,
                "state": e.state,
            }
            for e in stored_events
        ]
        result = session.execute(
            insert(table).returning(table.c.id, sort_by_parameter_order=True), rows
        )
        ids = [int(row_id) for row_id in result.scalars()]
        self._notify_channel(session)
        return ids


class HoledgerSQLAlchemyFactory(SQLAlchemyFactory):
    """eventsourcing-sqlalchemy's factory with engine settings holedger needs."""

    application_recorder_class = HoledgerApplicationRecorder

    def __init__(self, env: Environment) -> None:
        # SQLAlchemyFactory.__init__ makes its datastore without engine settings; it is
        # replaced here (pinned by tests/ledger/test_eventsourcing_pins.py).
        InfrastructureFactory.__init__(self, env)
        self._schema_name = self.env.get(self.SQLALCHEMY_SCHEMA)
        url = self.env.get(self.SQLALCHEMY_URL)
        if not url:
            raise ConfigError("no ledger URL configured")
        self.datastore = SQLAlchemyDatastore(url=url, **engine_kwargs(url))
        # eventsourcing-sqlalchemy 1.0.1's Transaction.__exit__ passes over an
        # OperationalError raised by COMMIT when it holds this process-local write lock
        # and the error's first argument is a sqlite3.OperationalError: an append could
        # then return as if stored. Without the lock that branch cannot be taken, so a
        # failed commit always raises; SQLite's busy timeout serialises writers anyway.
        self.datastore.write_lock = None

    def close(self) -> None:
        """Close the engine's pooled connections (SQLite files, PostgreSQL sockets) now.
        eventsourcing-sqlalchemy's factory leaves them open until the engine is garbage
        collected: a long-running process that opens ledgers would hold ever more."""
        engine = self.datastore.engine
        if isinstance(engine, Engine):
            engine.dispose()


@dataclass(frozen=True)
class PendingEvent:
    """An event decided, chained and encoded, but not yet signed."""

    originator_id: uuid.UUID
    originator_version: int
    role: Role
    envelope: dict[str, Any]
    signed: bytes

    @property
    def event_type(self) -> str:
        return str(self.envelope["type"])

    @property
    def prev_hash(self) -> str:
        return str(self.envelope["prev_hash"])


class SignedRecordMapper(Mapper[uuid.UUID]):
    """Maps pending events to signed record bytes, and stored records back to Records."""

    def __init__(self, signers: dict[Role, SigningKey], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.signers = signers

    def sign(self, event: PendingEvent) -> tuple[StoredEvent, Record]:
        record = sign_envelope(self.signers[event.role], event.envelope, event.signed)
        stored = StoredEvent(
            originator_id=event.originator_id,
            originator_version=event.originator_version,
            topic=event.event_type,
            state=record.raw,
        )
        return stored, record

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        raise TypeError("holedger events are signed by ChainedEventStore.put, not mapped alone")

    def to_domain_event(self, stored_event: StoredEvent) -> Record:  # type: ignore[override]
        """Parse a stored record and bind it to its stream columns (signature: replay)."""
        record = parse_record(bytes(stored_event.state))
        if str(stored_event.originator_id) != record.run_id:
            raise VerificationError(f"seq {record.seq}: stored in another run's stream")
        if stored_event.originator_version != record.seq + 1:
            raise VerificationError(f"seq {record.seq}: stored at the wrong stream position")
        if stored_event.topic != record.type:
            raise VerificationError(f"seq {record.seq}: stored topic differs from its type")
        return record


class ChainedEventStore(EventStore[uuid.UUID]):
    """Signs each batch in order, chaining it to the stream head it read or was given."""

    mapper: SignedRecordMapper

    def put(  # type: ignore[override]
        self, domain_events: Sequence[PendingEvent], **kwargs: Any
    ) -> list[Record]:
        """Sign and insert one batch; it must chain onto itself and onto the stored head.

        The batch was staged against a cached head; a stale cache is caught here by
        the unique stream position (IntegrityError) or, when the predecessor's hash is
        not the batch's ``prev_hash``, before anything is written.
        """
        if not domain_events:
            return []
        first = domain_events[0]
        expected = self.hash_before(first.originator_id, first.originator_version)
        if first.prev_hash != expected:
            raise LedgerConflictError("the stream head moved; re-read the run")
        stored_events: list[StoredEvent] = []
        records: list[Record] = []
        prev = first.prev_hash
        for event in domain_events:
            if event.prev_hash != prev:
                raise VerificationError("batch is not chained in order")
            stored, record = self.mapper.sign(event)
            stored_events.append(stored)
            records.append(record)
            prev = record.event_hash
        self.recorder.insert_events(stored_events, **kwargs)
        return records

    def hash_before(self, originator_id: uuid.UUID, version: int) -> str:
        """The event hash the event at stream ``version`` must chain to.

        One indexed read through the driver; the stored record is parsed before its
        hash is trusted.
        """
        if version == 1:
            return ZERO_HASH
        app_recorder: Any = self.recorder
        engine: Engine = app_recorder.datastore.engine
        sqlite = engine.dialect.name == "sqlite"
        mark = "?" if sqlite else "%s"
        sql = (
            f"SELECT state FROM {app_recorder.events_table_name} "
            f"WHERE originator_id = {mark} AND originator_version = {mark}"
        )
        with engine.connect() as conn:
            cursor = conn.connection.cursor()
            try:
                cursor.execute(sql, (originator_id.bytes if sqlite else originator_id, version - 1))
                row = cursor.fetchone()
            finally:
                cursor.close()
        if row is None:
            raise LedgerConflictError("the stream head moved; re-read the run")
        record = parse_record(bytes(row[0]))
        if record.run_id != str(originator_id) or record.seq != version - 2:
            raise VerificationError(f"seq {version - 2}: stored at the wrong stream position")
        return record.event_hash


class LedgerApplication(Application[uuid.UUID]):
    """The eventsourcing Application holding every run's stream."""

    name = APP_NAME

    def __init__(self, url: str, signers: dict[Role, SigningKey], create_table: bool) -> None:
        self._signers = signers
        env = {
            "PERSISTENCE_MODULE": f"{__name__}:HoledgerSQLAlchemyFactory",
            "SQLALCHEMY_URL": url,
            "CREATE_TABLE": "y" if create_table else "n",
            "IS_SNAPSHOTTING_ENABLED": "n",
        }
        super().__init__(env=env)

    def construct_mapper(self) -> SignedRecordMapper:
        return SignedRecordMapper(self._signers, transcoder=self.construct_transcoder())

    def construct_event_store(self) -> ChainedEventStore:
        return ChainedEventStore(mapper=self.mapper, recorder=self.recorder)

    @property
    def engine(self) -> Engine:
        engine: Engine = self.recorder.datastore.engine  # type: ignore[attr-defined]
        return engine

    @property
    def events_table(self) -> str:
        return f"{APP_NAME}_events"


LEDGER_URL_HINT = "give sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE"


def ledger_url(url: str) -> str:
    """``url`` when it names a database holedger stores ledgers in (SQLite, or PostgreSQL
    through psycopg 3), else ConfigError; ``postgresql://`` means psycopg 3 here (the
    driver holedger installs), not SQLAlchemy's default psycopg2."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            f"not a database URL: {redact_url(url)!r}", hint=LEDGER_URL_HINT
        ) from None
    if parsed.drivername == "postgresql":
        return url.replace("postgresql", "postgresql+psycopg", 1)
    if parsed.drivername not in ("sqlite", "sqlite+pysqlite", "postgresql+psycopg"):
        raise ConfigError(
            f"holedger cannot keep a ledger in {parsed.drivername!r} ({redact_url(url)})",
            hint=LEDGER_URL_HINT,
        )
    return url


def require_sqlite_file(url: str) -> None:
    """A reader or writer that must not create tables must not create the file either."""
    if not url.startswith("sqlite:///") or ":memory:" in url or "mode=memory" in url:
        return
    from pathlib import Path

    db_file = Path(url.removeprefix("sqlite:///").split("?", 1)[0])
    if not db_file.parent.is_dir() and db_file.name == "ledger.db":
        raise ConfigError(f"no holedger home at {db_file.parent}", hint=NO_HOME_HINT)
    if not db_file.is_file():
        raise ConfigError(f"no ledger at {db_file}", hint="run 'holedger init' to create it")


def open_error(exc: BaseException, url: str) -> HoledgerError:
    """Why the ledger at ``url`` cannot be opened, as one line naming it."""
    return storage_error(exc, url) or ConfigError(
        f"cannot open the ledger at {redact_url(url)}: {getattr(exc, 'orig', None) or exc}",
        hint="check --ledger, or run 'holedger init'",
    )


def redact_url(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
