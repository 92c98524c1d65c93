"""The audit log: a signed, hash-chained, checkpointed stream per audit, in the ledger's
own database (table ``holedger_audit_events``), built from the ledger's parts: canonical
JSON, Ed25519 keys, RFC 6962 Merkle trees and C2SP checkpoint notes.

Every append ends with a Checkpoint signed by the auditor key (origin
``holedger/audit/<audit id>``), so a cut tail is visible. :func:`verify_records` checks a
stream whole: canonical records, the chain, seq, signatures by role, checkpoint roots.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
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
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from holedger.audit.events import (
    AUDIT_EVENT_TYPES,
    AUDIT_ROLES,
    AUDIT_SCHEMA_VERSION,
    AuditCheckpoint,
    AuditRole,
)
from holedger.errors import LedgerConflictError, NotFoundError, UsageError
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note, verify_checkpoint
from holedger.ledger.records import utc_now
from holedger.schemas.canonical import b64decode_strict, canonical_json, parse_canonical
from holedger.schemas.types import ZERO_HASH

_metadata = MetaData()
audit_table = Table(
    "holedger_audit_events",
    _metadata,
    Column("audit_id", String(36), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("record", LargeBinary, nullable=False),
)


def audit_origin(audit_id: str) -> str:
    return f"holedger/audit/{audit_id}"


@dataclass(frozen=True)
class AuditRecord:
    """One stored audit event: its bytes, signed bytes, envelope and signature."""

    raw: bytes
    signed: bytes
    envelope: dict[str, Any]
    signature: bytes

    @property
    def seq(self) -> int:
        return int(self.envelope["seq"])

    @property
    def type(self) -> str:
        return str(self.envelope["type"])

    @property
    def role(self) -> str:
        return str(self.envelope["role"])

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.envelope["payload"]
        return payload

    @property
    def event_hash(self) -> str:
        return hashlib.sha256(self.signed).hexdigest()

    @property
    def leaf_hash(self) -> bytes:
        return hashlib.sha256(b"\x00" + self.signed).digest()


def sign_audit_event(
    key: SigningKey,
    *,
    audit_id: str,
    seq: int,
    event_type: str,
    role: AuditRole,
    prev_hash: str,
    payload: BaseModel | dict[str, Any],
) -> AuditRecord:
    body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    envelope = {
        "audit_id": audit_id,
        "seq": seq,
        "type": event_type,
        "schema_version": AUDIT_SCHEMA_VERSION,
        "time": utc_now(),
        "role": role,
        "key_id": key.key_id_hex,
        "prev_hash": prev_hash,
        "payload": body,
    }
    signed = canonical_json(envelope)
    signature = key.sign(signed)
    raw = canonical_json({**envelope, "sig": base64.b64encode(signature).decode()})
    return AuditRecord(raw, signed, envelope, signature)


def parse_audit_record(raw: bytes) -> AuditRecord:
    """Parse stored bytes: canonical JSON, the envelope's members, a 64-byte signature."""
    obj = parse_canonical(raw)
    if not isinstance(obj, dict) or not isinstance(obj.get("sig"), str):
        raise UsageError("audit record is not a signed JSON object")
    signature = b64decode_strict(obj.pop("sig")) or b""
    expected = {
        "audit_id",
        "seq",
        "type",
        "schema_version",
        "time",
        "role",
        "key_id",
        "prev_hash",
        "payload",
    }
    if set(obj) != expected or len(signature) != 64:
        raise UsageError("audit record envelope is malformed")
    return AuditRecord(raw, canonical_json(obj), obj, signature)


class AuditLog:
    """Audit streams in a ledger database. Writers sign with the keys they are given."""

    def __init__(self, engine: Engine, *, create: bool = True) -> None:
        self.engine = engine
        if create:
            _metadata.create_all(engine, checkfirst=True)

    def audit_ids(self) -> list[str]:
        if not inspect(self.engine).has_table(audit_table.name):
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(select(audit_table.c.audit_id).distinct())
            return sorted(str(row[0]) for row in rows)

    def resolve(self, prefix: str) -> str:
        prefix = prefix.strip().lower()
        if len(prefix) < 4:
            raise UsageError("an audit id prefix needs at least 4 characters")
        matches = [a for a in self.audit_ids() if a.startswith(prefix)]
        if not matches:
            raise NotFoundError(f"no audit {prefix}", hint="see 'holedger audit list'")
        if len(matches) > 1:
            raise UsageError(f"audit id prefix {prefix} is ambiguous ({len(matches)} audits)")
        return matches[0]

    def records(self, audit_id: str) -> list[AuditRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(audit_table.c.record)
                .where(audit_table.c.audit_id == audit_id)
                .order_by(audit_table.c.seq)
            ).all()
        return [parse_audit_record(bytes(row[0])) for row in rows]

    def new_id(self) -> str:
        return str(uuid.uuid4())

    def append(
        self,
        audit_id: str,
        items: Sequence[tuple[str, BaseModel, AuditRole]],
        keys: dict[str, SigningKey],
    ) -> list[AuditRecord]:
        """Append ``items`` and a Checkpoint (signed by the auditor key), atomically."""
        existing = self.records(audit_id)
        frontier = MerkleFrontier()
        for rec in existing:
            frontier.append(rec.leaf_hash)
        prev = existing[-1].event_hash if existing else ZERO_HASH
        seq = len(existing)
        out: list[AuditRecord] = []
        for event_type, payload, role in [*items]:
            if event_type not in AUDIT_EVENT_TYPES or role not in AUDIT_ROLES:
                raise UsageError(f"not an audit event: {event_type} by {role}")
            rec = sign_audit_event(
                keys[role],
                audit_id=audit_id,
                seq=seq,
                event_type=event_type,
                role=role,
                prev_hash=prev,
                payload=payload,
            )
            out.append(rec)
            frontier.append(rec.leaf_hash)
            prev, seq = rec.event_hash, seq + 1
        root = frontier.root()
        note = sign_note(checkpoint_body(audit_origin(audit_id), seq, root), keys["auditor"])
        cp = AuditCheckpoint(size=seq, root=root.hex(), note=note)
        out.append(
            sign_audit_event(
                keys["auditor"],
                audit_id=audit_id,
                seq=seq,
                event_type="Checkpoint",
                role="auditor",
                prev_hash=prev,
                payload=cp,
            )
        )
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(audit_table),
                    [{"audit_id": audit_id, "seq": r.seq, "record": r.raw} for r in out],
                )
        except IntegrityError as exc:
            raise LedgerConflictError(
                f"another writer appended to audit {audit_id} first", hint="run it again"
            ) from exc
        return out

    def write_raw(self, audit_id: str, records: Sequence[bytes]) -> None:
        """Replace a stream's stored bytes (for importing a bundle, and for tests that
        tamper with a log)."""
        with self.engine.begin() as conn:
            conn.execute(audit_table.delete().where(audit_table.c.audit_id == audit_id))
            conn.execute(
                insert(audit_table),
                [{"audit_id": audit_id, "seq": i, "record": raw} for i, raw in enumerate(records)],
            )


def verify_records(
    audit_id: str, records: Sequence[AuditRecord], keys: dict[str, PublicKey]
) -> list[str]:
    """Integrity of an audit stream: every problem found, as one line each (empty: intact).

    ``keys`` are the role keys to check signatures with (the auditor key as the audit
    declares it or as pinned, the audited run's server key).
    """
    problems: list[str] = []
    prev = ZERO_HASH
    frontier = MerkleFrontier()
    for index, rec in enumerate(records):
        env = rec.envelope
        where = f"audit seq {index} ({rec.type})"
        if env["audit_id"] != audit_id:
            problems.append(f"{where}: belongs to audit {env['audit_id']}")
        if env["seq"] != index:
            problems.append(f"{where}: seq is {env['seq']}")
        if env["schema_version"] != AUDIT_SCHEMA_VERSION:
            problems.append(f"{where}: unknown schema version {env['schema_version']}")
        if env["prev_hash"] != prev:
            problems.append(f"{where}: not chained to the event before it")
        key = keys.get(rec.role)
        if key is None:
            problems.append(f"{where}: role {rec.role!r} signs no audit event")
        elif env["key_id"] != key.key_id_hex or not key.verify(rec.signature, rec.signed):
            problems.append(f"{where}: not signed by the {rec.role} key {key.key_id_hex}")
        model = AUDIT_EVENT_TYPES.get(rec.type)
        if model is None:
            problems.append(f"{where}: unknown event type")
        else:
            try:
                model.model_validate(rec.payload)
            except ValidationError as exc:
                problems.append(f"{where}: payload invalid ({exc.errors()[0]['msg']})")
        if rec.type == "Checkpoint":
            problems += _checkpoint_problems(audit_id, rec, frontier, keys.get("auditor"), where)
        frontier.append(rec.leaf_hash)
        prev = rec.event_hash
    if not records:
        problems.append("the audit has no events")
    elif records[-1].type != "Checkpoint":
        problems.append("the audit's last event is not a Checkpoint: its tail was cut")
    return problems


def _checkpoint_problems(
    audit_id: str,
    rec: AuditRecord,
    frontier: MerkleFrontier,
    auditor: PublicKey | None,
    where: str,
) -> list[str]:
    payload = rec.payload
    root = frontier.root().hex()
    problems = []
    if payload.get("size") != frontier.size or payload.get("root") != root:
        problems.append(f"{where}: size and root are not those of the events before it")
    if auditor is not None:
        try:
            verified = verify_checkpoint(
                str(payload.get("note", "")), [auditor], origin=audit_origin(audit_id)
            )
        except Exception as exc:  # a note that does not verify, whatever the reason
            problems.append(f"{where}: its note does not verify ({exc})")
        else:
            cp = verified.checkpoint
            if cp.size != payload.get("size") or cp.root.hex() != payload.get("root"):
                problems.append(f"{where}: its note names another size or root")
    return problems
