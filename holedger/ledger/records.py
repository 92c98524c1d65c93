"""Signed event records: building, signing and verifying one event.

A *record* is the canonical JSON of the envelope plus a ``sig`` member. The *signed
bytes* are the canonical JSON of the envelope alone (the record minus ``sig``). Then:

* ``sig``       = Ed25519(signed bytes), standard base64;
* event hash    = SHA-256(signed bytes), the next event's ``prev_hash``;
* Merkle leaf   = SHA-256(0x00 || signed bytes) (RFC 6962 section 2.1).

Verification never re-interprets a payload before its signature is checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from holedger.errors import CanonicalError, SchemaError, VerificationError
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.schemas.canonical import canonical_json, parse_canonical
from holedger.schemas.events import EVENT_TYPES, SCHEMA_VERSION, EventEnvelope, Model
from holedger.schemas.types import Role

ENVELOPE_FIELDS = frozenset(EventEnvelope.model_fields)


def utc_now() -> str:
    """The envelope's time format: UTC, microseconds, a literal Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def payload_dict(event_type: str, payload: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """Validate ``payload`` against its type's model and return its JSON form."""
    model = EVENT_TYPES.get(event_type)
    if model is None:
        raise SchemaError(f"unknown event type {event_type!r}")
    try:
        if isinstance(payload, BaseModel):
            if not isinstance(payload, model):
                raise SchemaError(f"payload is a {type(payload).__name__}, not {event_type}")
            obj = payload
        else:
            obj = model.model_validate(payload)
    except ValidationError as exc:
        raise SchemaError(f"{event_type} payload invalid: {_first_error(exc)}") from exc
    return obj.model_dump(mode="json")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" if loc else str(err["msg"])


@dataclass(frozen=True)
class Record:
    """One stored, signed event: its record bytes and what is derived from them."""

    raw: bytes
    signed: bytes
    envelope: dict[str, Any]
    signature: bytes

    @property
    def run_id(self) -> str:
        return str(self.envelope["run_id"])

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
    def key_id(self) -> str:
        return str(self.envelope["key_id"])

    @property
    def prev_hash(self) -> str:
        return str(self.envelope["prev_hash"])

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

    def verify_signature(self, key: PublicKey) -> bool:
        return key.verify(self.signature, self.signed)

    def typed_payload(self) -> Model:
        """The payload parsed into its model; SchemaError when it does not fit."""
        model = EVENT_TYPES.get(self.type)
        if model is None:
            raise SchemaError(f"unknown event type {self.type!r}")
        if self.envelope.get("schema_version") != SCHEMA_VERSION:
            raise SchemaError(f"unknown schema version {self.envelope.get('schema_version')!r}")
        try:
            return model.model_validate(self.payload)
        except ValidationError as exc:
            raise SchemaError(f"{self.type} payload invalid: {_first_error(exc)}") from exc


def sign_event(
    key: SigningKey,
    *,
    run_id: str,
    seq: int,
    event_type: str,
    role: Role,
    prev_hash: str,
    payload: dict[str, Any],
    time: str | None = None,
) -> Record:
    """Build and sign one event; ``payload`` must already be its model's JSON form."""
    envelope = {
        "run_id": run_id,
        "seq": seq,
        "type": event_type,
        "schema_version": SCHEMA_VERSION,
        "time": time or utc_now(),
        "role": role,
        "key_id": key.key_id_hex,
        "prev_hash": prev_hash,
        "payload": payload,
    }
    return sign_envelope(key, envelope, canonical_json(envelope))


def sign_envelope(key: SigningKey, envelope: dict[str, Any], signed: bytes) -> Record:
    """Sign already-encoded envelope bytes (``signed`` must be canonical_json(envelope))."""
    signature = key.sign(signed)
    record = dict(envelope)
    record["sig"] = base64.b64encode(signature).decode()
    return Record(canonical_json(record), signed, envelope, signature)


def parse_record(raw: bytes) -> Record:
    """Parse stored record bytes without trusting them: canonical form and shape only.

    Raises VerificationError naming what is wrong. The signature is *not* checked here
    (the verifier must choose the key by role from RunOpened); see ``Record.verify_signature``.
    """
    try:
        obj = parse_canonical(raw)
    except CanonicalError as exc:
        raise VerificationError(f"record is not canonical JSON: {exc.message}") from exc
    if not isinstance(obj, dict):
        raise VerificationError("record is not a JSON object")
    sig_b64 = obj.pop("sig", None)
    if not isinstance(sig_b64, str):
        raise VerificationError("record has no signature")
    if set(obj) != ENVELOPE_FIELDS:
        missing = sorted(ENVELOPE_FIELDS - set(obj))
        extra = sorted(set(obj) - ENVELOPE_FIELDS)
        raise VerificationError(f"record envelope fields wrong (missing {missing}, extra {extra})")
    try:
        signature = base64.b64decode(sig_b64, validate=True)
    except binascii.Error as exc:
        raise VerificationError("signature is not base64") from exc
    if len(signature) != 64:
        raise VerificationError("signature is not 64 bytes")
    try:
        EventEnvelope.model_validate(obj)
    except ValidationError as exc:
        raise VerificationError(f"envelope invalid: {_first_error(exc)}") from exc
    signed = canonical_json(obj)
    return Record(raw, signed, obj, signature)
