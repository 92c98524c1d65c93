"""The write side of the ledger: signed, hash-chained runs stored through eventsourcing.

Each run is one eventsourcing stream (originator id = the run id as a UUID, originator
version = seq + 1). Two supported eventsourcing hooks carry the cryptography:

* :class:`SignedRecordMapper` (``Application.construct_mapper``) turns a pending event
  into a stored event whose ``state`` is the signed record bytes, and back; it binds the
  stream columns (originator id, version, topic) to the signed envelope on read.
* :class:`ChainedEventStore` (``Application.construct_event_store``) supplies each batch's
  ``prev_hash`` from the stream head and signs the batch in order.

The unique (originator id, version) index makes a racing writer fail with a conflict
instead of forking the chain; :class:`Ledger` turns that into ``LedgerConflictError`` and
callers decide again on fresh state. Blobs live in a ``holedger_blobs`` table of the same
database, so one URL is the whole ledger.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventsourcing.application import Application
from eventsourcing.persistence import (
    EventStore,
    InfrastructureFactory,
    IntegrityError,
    Mapper,
    PersistenceError,
    StoredEvent,
)
from eventsourcing.utils import Environment
from eventsourcing_sqlalchemy.datastore import SQLAlchemyDatastore
from eventsourcing_sqlalchemy.factory import SQLAlchemyFactory
from eventsourcing_sqlalchemy.recorders import SQLAlchemyApplicationRecorder
from pydantic import BaseModel
from sqlalchemy import (
    Column,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session

from holedger.config import DEFAULT_KEY_NAME, Settings
from holedger.errors import (
    ConfigError,
    HoledgerError,
    LedgerConflictError,
    NotFoundError,
    RunClosedError,
    UsageError,
    VerificationError,
)
from holedger.ledger import closing
from holedger.ledger.failures import storage_error
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import NO_HOME_HINT, SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note
from holedger.ledger.records import Record, payload_dict, sign_envelope, utc_now
from holedger.protocol.runs import checked_run_id, new_run_id, origin_of
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import (
    SCHEMA_VERSION,
    Checkpoint,
    OptimizerDescriptor,
    PublicKeyInfo,
    RunClosed,
    RunOpened,
    SeedBaseline,
    TaskTerms,
)
from holedger.schemas.types import ROLES, ZERO_HASH, Role

APP_NAME = "holedger"
DEFAULT_CHECKPOINT_INTERVAL = 64
READ_BATCH = 1000
MAX_BLOB_BYTES = 64 << 20

_metadata = MetaData()
blobs_table = Table(
    "holedger_blobs",
    _metadata,
    Column("digest", String(64), primary_key=True),
    Column("size", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
)


def blob_rows(blobs: Sequence[bytes]) -> tuple[list[str], list[dict[str, Any]]]:
    """The blobs' digests in order, and one blobs-table row per distinct blob."""
    for data in blobs:
        if len(data) > MAX_BLOB_BYTES:
            raise UsageError(f"blob of {len(data)} bytes is over the {MAX_BLOB_BYTES} byte cap")
    digests = [hashlib.sha256(data).hexdigest() for data in blobs]
    rows = {
        d: {"digest": d, "size": len(b), "data": b} for d, b in zip(digests, blobs, strict=True)
    }
    return digests, list(rows.values())


def insert_blobs(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert blobs-table rows in ``session``'s transaction; a blob already there is kept
    (content addressed: same digest, same bytes)."""
    dialect = session.get_bind().dialect.name
    # In digest order: two writers inserting overlapping sets take the rows' locks in the
    # same order, so neither waits for the other while holding what it needs (deadlock).
    ordered = sorted(rows, key=lambda row: str(row["digest"]))
    if dialect in ("sqlite", "postgresql"):
        # The driver's executemany, skipping SQLAlchemy's per-row bind processing of the
        # binary column (it cost more than the insert); errors still come wrapped as
        # SQLAlchemy's, which the recorder's transaction turns into eventsourcing's.
        mark = "?" if dialect == "sqlite" else "%s"
        sql = (
            f"INSERT INTO {blobs_table.name} (digest, size, data) "
            f"VALUES ({mark}, {mark}, {mark}) ON CONFLICT (digest) DO NOTHING"
        )
        session.connection().exec_driver_sql(
            sql, [(row["digest"], row["size"], row["data"]) for row in ordered]
        )
    else:
        for row in ordered:
            present = session.execute(
                select(blobs_table.c.size).where(blobs_table.c.digest == row["digest"])
            ).first()
            if present is None:
                session.execute(blobs_table.insert().values(**row))


def run_uuid(run_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(run_id)
    except ValueError as exc:
        raise UsageError(f"not a run id: {run_id!r}", hint="see 'holedger run list'") from exc


# --------------------------------------------------------------------------- persistence


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


# --------------------------------------------------------------------------- the facade


@dataclass
class _Head:
    next_seq: int
    last_hash: str
    frontier: MerkleFrontier
    since_checkpoint: int
    closed: bool = False


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    task_id: str
    optimizer: str
    events: int
    state: str
    opened: str
    closed: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


CLOSE_ATTEMPTS = 50


class Ledger:
    """The ledger of many runs: append signed events, store blobs, read records back."""

    def __init__(
        self,
        url: str,
        signers: dict[Role, SigningKey],
        *,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        create_tables: bool = True,
    ) -> None:
        if checkpoint_interval < 1:
            raise UsageError("checkpoint interval must be at least 1")
        url = ledger_url(url)
        self.url = url
        self.signers = signers
        self.checkpoint_interval = checkpoint_interval
        if not create_tables:
            _require_sqlite_file(url)
        try:
            self.app = LedgerApplication(url, signers, create_tables)
        except (PersistenceError, SQLAlchemyError) as exc:
            raise _open_error(exc, url) from exc
        if create_tables:
            try:
                _metadata.create_all(self.app.engine, checkfirst=True)
            except SQLAlchemyError as exc:
                self.app.close()
                raise _open_error(exc, url) from exc
        elif not self._has_tables():
            self.app.close()
            raise ConfigError(
                f"the ledger at {_redact(url)} has no holedger tables",
                hint="run 'holedger init' once with this --ledger URL",
            )
        self._heads: dict[str, _Head] = {}
        self._lock = threading.RLock()
        # Called with a run id before its RunClosed is appended (a gateway of this
        # process ends the run's calls there); see ledger.closing.
        self.close_hooks: list[Callable[[str], None]] = []

    def _has_tables(self) -> bool:
        try:
            return bool(inspect(self.app.engine).has_table(self.app.events_table))
        except SQLAlchemyError as exc:
            self.app.close()
            raise _open_error(exc, self.url) from exc

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        url: str,
        signer: SigningKey | dict[Role, SigningKey] | None = None,
        *,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        create_tables: bool = True,
    ) -> Ledger:
        """Open the ledger at ``url``; a reader may pass no signer (a throwaway key)."""
        if signer is None:
            signer = SigningKey.generate("holedger-reader")
        signers = signer if isinstance(signer, dict) else dict.fromkeys(ROLES, signer)
        missing = [role for role in ROLES if role not in signers]
        if missing:
            raise ConfigError(f"no signing key for roles {missing}")
        return cls(
            url, signers, checkpoint_interval=checkpoint_interval, create_tables=create_tables
        )

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Ledger:
        """Open the home's ledger with the home's operator key (see ``holedger init``)."""
        from holedger.ledger.home import refuse_emptied_ledger

        key = SigningKey.load(settings.key_path)
        _require_sqlite_file(settings.ledger_url)  # opening must not create a ledger
        refuse_emptied_ledger(settings)
        # PostgreSQL: the schema is created once by 'holedger init'; writers never race
        # on DDL ("tuple concurrently updated" when several create it at once).
        kwargs.setdefault("create_tables", not settings.ledger_url.startswith("postgresql"))
        return cls.open(settings.ledger_url, key, **kwargs)

    @staticmethod
    def init_home(settings: Settings, key_name: str = DEFAULT_KEY_NAME) -> tuple[SigningKey, bool]:
        """Create the home, its key (0600) and its ledger; return the key, and if it is new."""
        from holedger.ledger.home import refuse_emptied_ledger

        settings.home.mkdir(parents=True, exist_ok=True)
        refuse_emptied_ledger(settings)
        created = False
        if settings.key_path.exists():
            key = SigningKey.load(settings.key_path)
        else:
            from holedger.ledger.home import refuse_lost_key

            refuse_lost_key(settings)
            key = SigningKey.generate(key_name)
            key.save(settings.key_path)
            settings.pub_path.write_text(key.public.vkey() + "\n")
            created = True
        ledger = Ledger.open(settings.ledger_url, key)
        ledger.close()
        return key, created

    def close(self) -> None:
        self.app.close()

    # ---------------------------------------------------------------- writing

    def declared_keys(self) -> dict[Role, PublicKeyInfo]:
        return {
            role: PublicKeyInfo(name=key.name, key_id=key.key_id_hex, public_key=key.public.b64)
            for role, key in self.signers.items()
        }

    def open_run(
        self,
        terms: TaskTerms,
        *,
        task_digest: str,
        optimizer: str = "unnamed",
        seed_baseline: SeedBaseline | None = None,
        run_id: str | None = None,
        descriptor: OptimizerDescriptor | None = None,
    ) -> str:
        """Start a run: RunOpened at seq 0 declaring this ledger's keys by role."""
        run_id = checked_run_id(run_id or new_run_id())
        payload = RunOpened(
            task_id=terms.task_id,
            task_digest=task_digest,
            terms=terms,
            seed_baseline=seed_baseline,
            optimizer=optimizer,
            descriptor=descriptor,
            keys=self.declared_keys(),
            origin=origin_of(run_id),
            checkpoint_interval=self.checkpoint_interval,
        )
        self.append_many(run_id, [("RunOpened", payload, "server")], expected_seq=0)
        return run_id

    def append(
        self, run_id: str, event_type: str, payload: BaseModel | dict[str, Any], role: Role
    ) -> Record:
        """Append one event; see :meth:`append_many`."""
        records = self.append_many(run_id, [(event_type, payload, role)])
        return next(r for r in records if r.type == event_type)

    def append_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, BaseModel | dict[str, Any], Role]],
        *,
        expected_seq: int | None = None,
        blobs: Sequence[bytes] = (),
    ) -> list[Record]:
        """Append ``items`` atomically, with automatic Checkpoint events in between.

        ``expected_seq`` is the seq the first item must get; when another writer has
        appended since, LedgerConflictError is raised and nothing is written. ``blobs``
        are stored in the same transaction, before the events (which may refer to them).
        """
        if not items:
            self.put_blobs(blobs)
            return []
        _, blob_table_rows = blob_rows(blobs)
        rid = run_uuid(checked_run_id(run_id))
        with self._lock:
            head = self._head(run_id)
            if expected_seq is not None and expected_seq != head.next_seq:
                # Either side may be stale: forget the cached head so a retry re-reads.
                self._heads.pop(run_id, None)
                raise LedgerConflictError(
                    f"run {run_id} is at seq {head.next_seq}, not {expected_seq}",
                    hint="re-read the run and decide again",
                )
            if head.closed:
                # Nothing follows RunClosed and its Checkpoint, whoever writes: a writer
                # whose cached head predates the close loses the seq race above or here.
                raise RunClosedError(
                    f"run {run_id} is closed: nothing more is recorded in it",
                    hint="open a new run",
                )
            new_head = _Head(
                head.next_seq, head.last_hash, head.frontier.copy(), head.since_checkpoint
            )
            pending: list[PendingEvent] = []
            for event_type, payload, role in items:
                if role not in ROLES:
                    raise UsageError(f"unknown role {role!r}")
                body = payload_dict(event_type, payload)
                self._stage(rid, new_head, pending, event_type, role, body)
                if event_type == "RunClosed" or (
                    event_type != "Checkpoint"
                    and new_head.since_checkpoint >= self.checkpoint_interval
                ):
                    self._stage_checkpoint(run_id, rid, new_head, pending)
            try:
                records: list[Record] = self.app.events.put(  # type: ignore[assignment]
                    pending, blobs=blob_table_rows
                )
            except IntegrityError as exc:
                self._heads.pop(run_id, None)
                raise LedgerConflictError(
                    f"another writer appended to run {run_id} first",
                    hint="re-read the run and decide again",
                ) from exc
            except (LedgerConflictError, PersistenceError):
                # The cached head is stale (or the write failed): forget it, so the
                # caller's retry re-reads the run from the database.
                self._heads.pop(run_id, None)
                raise
            new_head.closed = any(event_type == "RunClosed" for event_type, _, _ in items)
            self._heads[run_id] = new_head
            return list(records)

    def _stage(
        self,
        rid: uuid.UUID,
        head: _Head,
        pending: list[PendingEvent],
        event_type: str,
        role: Role,
        body: dict[str, Any],
    ) -> None:
        envelope = {
            "run_id": str(rid),
            "seq": head.next_seq,
            "type": event_type,
            "schema_version": SCHEMA_VERSION,
            "time": utc_now(),
            "role": role,
            "key_id": self.signers[role].key_id_hex,
            "prev_hash": head.last_hash,
            "payload": body,
        }
        signed = canonical_json(envelope)
        pending.append(PendingEvent(rid, head.next_seq + 1, role, envelope, signed))
        head.frontier.append(hashlib.sha256(b"\x00" + signed).digest())
        head.last_hash = hashlib.sha256(signed).hexdigest()
        head.next_seq += 1
        head.since_checkpoint = 0 if event_type == "Checkpoint" else head.since_checkpoint + 1

    def _stage_checkpoint(
        self, run_id: str, rid: uuid.UUID, head: _Head, pending: list[PendingEvent]
    ) -> None:
        size = head.frontier.size
        root = head.frontier.root()
        note = sign_note(checkpoint_body(origin_of(run_id), size, root), self.signers["server"])
        payload = Checkpoint(size=size, root=root.hex(), note=note).model_dump(mode="json")
        self._stage(rid, head, pending, "Checkpoint", "server", payload)

    def close_run(
        self, run_id: str, reason: str = "completed", summary: dict[str, Any] | None = None
    ) -> list[Record]:
        """RunClosed, then the final Checkpoint covering every event of the run; every
        token of the run dies first, in the order ledger.closing describes."""
        payload = RunClosed(reason=reason, summary=summary or {})
        if self._head(run_id).closed:
            raise RunClosedError(f"run {run_id} is already closed")
        closing.mark_closed(self.app.engine, run_id)
        for hook in list(self.close_hooks):
            hook(run_id)
        if closing.gateway_elsewhere(self.app.engine):
            time.sleep(closing.CLOSE_VISIBLE_WITHIN_S)
        for _ in range(CLOSE_ATTEMPTS):  # RunClosed depends on no decision: a lost race
            try:  # with another writer (a call recorded just before) is simply retried
                return self.append_many(run_id, [("RunClosed", payload, "server")])
            except LedgerConflictError:
                continue
        return self.append_many(run_id, [("RunClosed", payload, "server")])

    def is_closed(self, run_id: str) -> bool:
        """Whether the run is closed, or closing (its tokens are dead)."""
        engine = self.app.engine
        return closing.is_marked_closed(engine, run_id) or closing.has_run_closed_event(
            engine, self.app.events_table, run_uuid(run_id)
        )

    # ---------------------------------------------------------------- reading

    @property
    def mapper(self) -> SignedRecordMapper:
        mapper = self.app.mapper
        assert isinstance(mapper, SignedRecordMapper)
        return mapper

    def _head(self, run_id: str) -> _Head:
        head = self._heads.get(run_id)
        if head is not None:
            return head
        head = _Head(0, ZERO_HASH, MerkleFrontier(), 0)
        for record in self.records(run_id):
            head.frontier.append(record.leaf_hash)
            head.last_hash = record.event_hash
            head.next_seq = record.seq + 1
            head.since_checkpoint = 0 if record.type == "Checkpoint" else head.since_checkpoint + 1
            head.closed = head.closed or record.type == "RunClosed"
        return head

    def records(self, run_id: str, after_seq: int = -1) -> Iterator[Record]:
        """The run's stored records in seq order, parsed but not verified."""
        for stored in self.stored_events(run_id, after_seq):
            yield self.mapper.to_domain_event(stored)

    def stored_events(self, run_id: str, after_seq: int = -1) -> Iterator[StoredEvent]:
        """The run's raw stored events (state = record bytes) in stream order."""
        rid = run_uuid(run_id)
        version = after_seq + 1
        while True:
            batch = self.app.recorder.select_events(rid, gt=version, limit=READ_BATCH)
            if not batch:
                return
            yield from batch
            version = batch[-1].originator_version

    def raw_records(self, run_id: str) -> Iterator[tuple[int, bytes]]:
        """(stream version, record bytes) in order, read in batches with plain SQL."""
        for rows in self._record_rows(run_id):
            for version, state in rows:
                yield version, bytes(state)

    def raw_record_batches(self, run_id: str) -> Iterator[list[bytes]]:
        """The record bytes in order, a database batch at a time (what replay reads)."""
        for rows in self._record_rows(run_id):
            yield [bytes(state) for _, state in rows]

    def _record_rows(self, run_id: str) -> Iterator[Sequence[Any]]:
        """(version, state) rows in order, straight through the database driver's cursor:
        replay reads every record once, and a result-row layer would cost more than
        parsing the record."""
        rid = run_uuid(run_id)
        table = self.app.events_table
        engine = self.app.engine
        sqlite = engine.dialect.name == "sqlite"
        mark = "?" if sqlite else "%s"
        sql = (
            f"SELECT originator_version, state FROM {table} "
            f"WHERE originator_id = {mark} AND originator_version > {mark} "
            f"ORDER BY originator_version LIMIT {mark}"
        )
        rid_param: Any = rid.bytes if sqlite else rid
        version = 0
        while True:
            with engine.connect() as conn:
                cursor = conn.connection.cursor()
                try:
                    cursor.execute(sql, (rid_param, version, READ_BATCH * 2))
                    rows = cursor.fetchall()
                finally:
                    cursor.close()
            if not rows:
                return
            yield rows
            version = rows[-1][0]

    def has_run(self, run_id: str) -> bool:
        rid = run_uuid(run_id)
        return bool(self.app.recorder.select_events(rid, limit=1))

    def first_record(self, run_id: str) -> Record:
        rid = run_uuid(run_id)
        events = self.app.recorder.select_events(rid, limit=1)
        if not events:
            raise NotFoundError(f"no run {run_id}", hint="see 'holedger run list'")
        record: Record = self.mapper.to_domain_event(events[0])
        return record

    def stored_count(self, run_id: str) -> int:
        """How many records the run has stored (its last stream version; 0 for none)."""
        events = self.app.recorder.select_events(run_uuid(run_id), desc=True, limit=1)
        return int(events[0].originator_version) if events else 0

    def last_record(self, run_id: str) -> Record:
        rid = run_uuid(run_id)
        events = self.app.recorder.select_events(rid, desc=True, limit=1)
        if not events:
            raise NotFoundError(f"no run {run_id}", hint="see 'holedger run list'")
        record: Record = self.mapper.to_domain_event(events[0])
        return record

    def run_terms(self, run_id: str) -> RunOpened:
        first = self.first_record(run_id)
        if first.type != "RunOpened":
            raise VerificationError(f"run {run_id} does not start with RunOpened")
        opened = first.typed_payload()
        assert isinstance(opened, RunOpened)
        return opened

    def run_ids(self) -> list[str]:
        table = self.app.events_table
        with self.app.engine.connect() as conn:
            rows = conn.execute(text(f"SELECT DISTINCT originator_id FROM {table}"))
            ids = [_uuid_str(row[0]) for row in rows]
        return sorted(ids)

    def resolve_run(self, prefix: str) -> str:
        """A run id from a unique prefix of at least 4 characters."""
        prefix = prefix.strip().lower()
        if len(prefix) < 4:
            raise UsageError(
                "a run id prefix needs at least 4 characters", hint="see 'holedger run list'"
            )
        if len(prefix) > len(_UUID_SHAPE) or any(
            (c == "-") != (shape == "-") or c not in "-0123456789abcdef"
            for c, shape in zip(prefix, _UUID_SHAPE, strict=False)
        ):
            raise UsageError(
                f"not a run id: {prefix!r}",
                hint="a run id is a UUID such as 7707f7cb-d97d-..., or its first characters; "
                "see 'holedger run list'",
            )
        matches = [rid for rid in self.run_ids() if rid.startswith(prefix)]
        if not matches:
            raise NotFoundError(f"no run {prefix}", hint="see 'holedger run list'")
        if len(matches) > 1:
            raise UsageError(f"run id prefix {prefix} is ambiguous ({len(matches)} runs)")
        return matches[0]

    def runs(self) -> list[RunInfo]:
        infos = []
        for run_id in self.run_ids():
            try:
                first = self.first_record(run_id)
                last = self.last_record(run_id)
                payload = first.payload if first.type == "RunOpened" else {}
                reason = self._closed(run_id, last.seq) if last.type == "Checkpoint" else None
                if reason is None and closing.has_run_closed_event(
                    self.app.engine, self.app.events_table, run_uuid(run_id)
                ):
                    reason = "?"  # closed, with events after RunClosed (replay fails it)
                closed = reason is not None
            except VerificationError:
                infos.append(RunInfo(run_id, "?", "?", 0, "damaged", "?"))
                continue
            infos.append(
                RunInfo(
                    run_id=run_id,
                    task_id=str(payload.get("task_id", "?")),
                    optimizer=str(payload.get("optimizer", "?")),
                    events=last.seq + 1,
                    # "aborted": closed by `holedger run abort`, without a score
                    state=("aborted" if reason == "aborted" else "closed") if closed else "open",
                    opened=str(first.envelope["time"]),
                    closed=str(last.envelope["time"]) if closed else None,
                )
            )
        return sorted(infos, key=lambda info: info.opened)

    def _closed(self, run_id: str, last_seq: int) -> str | None:
        """The RunClosed reason (``completed``, ``aborted``, ...) of a closed run, else
        None. A run is closed when its last two events are RunClosed and a Checkpoint."""
        if last_seq < 1:
            return None
        before = self.app.recorder.select_events(
            run_uuid(run_id), gt=last_seq - 1, lte=last_seq, limit=1
        )
        if not before or before[0].topic != "RunClosed":
            return None
        reason = self.mapper.to_domain_event(before[0]).payload.get("reason")
        return str(reason) if reason is not None else "?"

    # ---------------------------------------------------------------- blobs

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` under its SHA-256 (hex); idempotent."""
        return self.put_blobs([data])[0]

    def put_blobs(self, blobs: Sequence[bytes]) -> list[str]:
        """Store many blobs in one transaction; idempotent; returns their digests in order."""
        digests, rows = blob_rows(blobs)
        if rows:
            with Session(self.app.engine) as session, session.begin():
                insert_blobs(session, rows)
        return digests

    def get_blob(self, digest: str) -> bytes:
        with self.app.engine.connect() as conn:
            row = conn.execute(
                select(blobs_table.c.data).where(blobs_table.c.digest == digest)
            ).first()
        if row is None:
            raise NotFoundError(f"no blob {digest}")
        return bytes(row[0])

    def has_blob(self, digest: str) -> bool:
        with self.app.engine.connect() as conn:
            row = conn.execute(
                select(blobs_table.c.size).where(blobs_table.c.digest == digest)
            ).first()
        return row is not None


# a UUID's canonical spelling: a run id prefix is lower-case hex with hyphens just here
_UUID_SHAPE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"

LEDGER_URL_HINT = "give sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE"


def ledger_url(url: str) -> str:
    """``url`` when it names a database holedger stores ledgers in (SQLite, or PostgreSQL
    through psycopg 3), else ConfigError; ``postgresql://`` means psycopg 3 here (the
    driver holedger installs), not SQLAlchemy's default psycopg2."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"not a database URL: {_redact(url)!r}", hint=LEDGER_URL_HINT) from None
    if parsed.drivername == "postgresql":
        return url.replace("postgresql", "postgresql+psycopg", 1)
    if parsed.drivername not in ("sqlite", "sqlite+pysqlite", "postgresql+psycopg"):
        raise ConfigError(
            f"holedger cannot keep a ledger in {parsed.drivername!r} ({_redact(url)})",
            hint=LEDGER_URL_HINT,
        )
    return url


def _require_sqlite_file(url: str) -> None:
    """A reader or writer that must not create tables must not create the file either."""
    if not url.startswith("sqlite:///") or ":memory:" in url or "mode=memory" in url:
        return
    from pathlib import Path

    db_file = Path(url.removeprefix("sqlite:///").split("?", 1)[0])
    if not db_file.parent.is_dir() and db_file.name == "ledger.db":
        raise ConfigError(f"no holedger home at {db_file.parent}", hint=NO_HOME_HINT)
    if not db_file.is_file():
        raise ConfigError(f"no ledger at {db_file}", hint="run 'holedger init' to create it")


def _uuid_str(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return str(uuid.UUID(bytes=bytes(value)))
    return str(uuid.UUID(str(value)))


def _open_error(exc: BaseException, url: str) -> HoledgerError:
    """Why the ledger at ``url`` cannot be opened, as one line naming it."""
    return storage_error(exc, url) or ConfigError(
        f"cannot open the ledger at {_redact(url)}: {getattr(exc, 'orig', None) or exc}",
        hint="check --ledger, or run 'holedger init'",
    )


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
