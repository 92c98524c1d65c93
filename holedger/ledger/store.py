"""The Ledger: the facade every room uses to append signed events, store blobs and read
runs back.

A batch is staged against the run's cached head (seq, event hash, Merkle frontier) and
signed and inserted by the SQL store (:mod:`holedger.ledger.sql`); checkpoints are added
every ``checkpoint_interval`` events and after RunClosed. The unique (originator id,
version) index makes a racing writer fail with a conflict instead of forking the chain;
the Ledger turns that into ``LedgerConflictError`` and callers decide again on fresh
state. Blobs (:mod:`holedger.ledger.blobs`) live in the same database, so one URL is the
whole ledger.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventsourcing.persistence import (
    IntegrityError,
    PersistenceError,
    StoredEvent,
)
from pydantic import BaseModel
from sqlalchemy import (
    inspect,
    select,
    text,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from holedger.config import DEFAULT_KEY_NAME, Settings
from holedger.errors import (
    ConfigError,
    LedgerConflictError,
    NotFoundError,
    RunClosedError,
    UsageError,
    VerificationError,
)
from holedger.ledger import closing
from holedger.ledger.blobs import blob_rows, blobs_table, create_blobs_table, insert_blobs
from holedger.ledger.keys import SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note
from holedger.ledger.records import Record, payload_dict, utc_now
from holedger.ledger.sql import (
    LedgerApplication,
    PendingEvent,
    SignedRecordMapper,
    ledger_url,
    open_error,
    redact_url,
    require_sqlite_file,
    run_uuid,
)
from holedger.protocol.runs import checked_run_id, checked_run_prefix, new_run_id, origin_of
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import (
    SCHEMA_VERSION,
    Checkpoint,
    ControlOf,
    EvolveTerms,
    OptimizerDescriptor,
    PublicKeyInfo,
    RescoreOf,
    RunClosed,
    RunOpened,
    SeedBaseline,
    TaskTerms,
)
from holedger.schemas.types import ROLES, ZERO_HASH, Role

DEFAULT_CHECKPOINT_INTERVAL = 64
READ_BATCH = 1000

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
    control_of: dict[str, str] | None = None  # a control run's RunOpened.control_of


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
            require_sqlite_file(url)
        try:
            self.app = LedgerApplication(url, signers, create_tables)
        except (PersistenceError, SQLAlchemyError) as exc:
            raise open_error(exc, url) from exc
        if create_tables:
            try:
                create_blobs_table(self.app.engine)
            except SQLAlchemyError as exc:
                self.app.close()
                raise open_error(exc, url) from exc
        elif not self._has_tables():
            self.app.close()
            raise ConfigError(
                f"the ledger at {redact_url(url)} has no holedger tables",
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
            raise open_error(exc, self.url) from exc

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
        require_sqlite_file(settings.ledger_url)  # opening must not create a ledger
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

            refuse_lost_key(settings, lambda url: Ledger.open(url, create_tables=False))
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
        rescore_of: RescoreOf | None = None,
        control_of: ControlOf | None = None,
        solve_evolve: EvolveTerms | None = None,
    ) -> str:
        """Start a run: RunOpened at seq 0 declaring this ledger's keys by role
        (``solve_evolve``: the terms of a solve-evolve run, see protocol/evolve.py)."""
        run_id = checked_run_id(run_id or new_run_id())
        payload = RunOpened(
            task_id=terms.task_id,
            task_digest=task_digest,
            terms=terms,
            seed_baseline=seed_baseline,
            optimizer=optimizer,
            descriptor=descriptor,
            rescore_of=rescore_of,
            control_of=control_of,
            solve_evolve=solve_evolve,
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
            # Nothing follows RunClosed and its Checkpoint, whoever writes (a writer whose
            # cached head predates the close loses the seq race above or here), but for
            # the server's record of an audit's control evaluations.
            after_close = closing.admit(run_id, head.closed, items)
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
            if after_close and new_head.since_checkpoint:  # a closed run ends with a Checkpoint
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
            new_head.closed = head.closed or any(
                event_type == "RunClosed" for event_type, _, _ in items
            )
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
        prefix = checked_run_prefix(prefix)
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
                closed = self._run_closed(run_id)
            except VerificationError:
                infos.append(RunInfo(run_id, "?", "?", 0, "damaged", "?"))
                continue
            reason = None if closed is None else str(closed.payload.get("reason", "?"))
            infos.append(
                RunInfo(
                    run_id=run_id,
                    task_id=str(payload.get("task_id", "?")),
                    optimizer=str(payload.get("optimizer", "?")),
                    events=last.seq + 1,
                    # "aborted": closed by `holedger run abort`, without a score
                    state=("aborted" if reason == "aborted" else "closed") if closed else "open",
                    opened=str(first.envelope["time"]),
                    # RunClosed's time: an audit's control evaluations may follow it
                    closed=str(closed.envelope["time"]) if closed else None,
                    control_of=payload.get("control_of"),
                )
            )
        return sorted(infos, key=lambda info: info.opened)

    def _run_closed(self, run_id: str) -> Record | None:
        """The RunClosed record of a closed run (an audit's control evaluations and their
        checkpoints may follow it), else None."""
        rid = run_uuid(run_id)
        version = closing.run_closed_version(self.app.engine, self.app.events_table, rid)
        if version is None:
            return None
        found = self.app.recorder.select_events(rid, gt=version - 1, lte=version, limit=1)
        record: Record | None = self.mapper.to_domain_event(found[0]) if found else None
        return record

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


def _uuid_str(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return str(uuid.UUID(bytes=bytes(value)))
    return str(uuid.UUID(str(value)))
