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
import hashlib
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from holedger.errors import CanonicalError, SchemaError, VerificationError
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.schemas.canonical import (
    b64decode_strict,
    canonical_json,
    parse_canonical,
)
from holedger.schemas.events import (
    EVENT_TYPES,
    RUN_ID_PATTERN,
    SCHEMA_VERSION,
    TIME_PATTERN,
    EventEnvelope,
    Model,
)
from holedger.schemas.types import ROLES, Role

ENVELOPE_FIELDS = frozenset(EventEnvelope.model_fields)


def utc_now() -> str:
    """The envelope's time format: UTC, microseconds, a literal Z."""
    return datetime.now(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


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


class Record:
    """One stored, signed event: its record bytes and what is derived from them.

    The envelope members are also kept as attributes, read once at parse time: replay
    touches them for every event. The payload's dict (``payload``) and the envelope's
    (``envelope``) are built on first use when the parser did not need them; a payload
    the parser already validated into its model is kept for ``typed_payload``.
    """

    __slots__ = (
        "_envelope",
        "_payload",
        "_payload_end",
        "_typed",
        "key_id",
        "prev_hash",
        "raw",
        "role",
        "run_id",
        "schema_version",
        "seq",
        "signature",
        "signed",
        "time",
        "type",
    )

    def __init__(
        self, raw: bytes, signed: bytes, envelope: dict[str, Any], signature: bytes
    ) -> None:
        self.raw = raw
        self.signed = signed
        self.signature = signature
        self._envelope: dict[str, Any] | None = envelope
        self.run_id: str = str(envelope["run_id"])
        self.seq: int = int(envelope["seq"])
        self.type: str = str(envelope["type"])
        self.role: str = str(envelope["role"])
        self.key_id: str = str(envelope["key_id"])
        self.prev_hash: str = str(envelope["prev_hash"])
        self.schema_version: object = envelope["schema_version"]
        self.time: object = envelope["time"]
        self._payload: dict[str, Any] | None = envelope["payload"]
        self._payload_end = 0
        self._typed: Model | None = None

    def __repr__(self) -> str:
        return f"Record(run_id={self.run_id!r}, seq={self.seq}, type={self.type!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    @property
    def payload(self) -> dict[str, Any]:
        """The payload as parsed JSON (a canonical record's payload member)."""
        if self._payload is None:
            parsed = from_json(self.raw[PAYLOAD_AT : self._payload_end])
            assert type(parsed) is dict  # the parser accepted these bytes as an object
            self._payload = parsed
        return self._payload

    @property
    def envelope(self) -> dict[str, Any]:
        """The signed envelope as a dict (the record without ``sig``)."""
        if self._envelope is None:
            self._envelope = {
                "key_id": self.key_id,
                "payload": self.payload,
                "prev_hash": self.prev_hash,
                "role": self.role,
                "run_id": self.run_id,
                "schema_version": self.schema_version,
                "seq": self.seq,
                "time": self.time,
                "type": self.type,
            }
        return self._envelope

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
        if self._typed is not None:
            return self._typed
        model = EVENT_TYPES.get(self.type)
        if model is None:
            raise SchemaError(f"unknown event type {self.type!r}")
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"unknown schema version {self.schema_version!r}")
        try:
            # strict: a JSON value of another type than the field's (false for an integer,
            # "1" for 1) is refused, not converted; the signed bytes mean what they say
            self._typed = model.model_validate(self.payload, strict=True)
        except ValidationError as exc:
            raise SchemaError(f"{self.type} payload invalid: {_first_error(exc)}") from exc
        return self._typed


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
    return Record(record_bytes(signed, signature), signed, envelope, signature)


_TIME_MEMBER = b',"time":"'


def record_bytes(signed: bytes, signature: bytes) -> bytes:
    """The canonical record: the signed bytes with ``"sig"`` inserted before ``"time"``.

    Equal to the canonical JSON of the envelope plus ``sig`` (``sig`` sorts between
    ``seq`` and ``time``), without encoding the payload a second time.
    """
    at = signed.rfind(_TIME_MEMBER)
    if at < 0:
        raise VerificationError("envelope has no time member")
    sig = b',"sig":"' + base64.b64encode(signature) + b'"'
    return signed[:at] + sig + signed[at:]


def parse_record_strict(raw: bytes) -> Record:
    """The reference parser: strict JSON, re-encoded and compared; names every problem.

    Raises VerificationError naming what is wrong. The signature is *not* checked here
    (the verifier must choose the key by role from RunOpened); see ``Record.verify_signature``.
    ``holedger.ledger.fastpath.parse_record`` gives the same answer faster.
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
    signature = b64decode_strict(sig_b64)
    if signature is None:
        raise VerificationError("signature is not base64")
    if len(signature) != 64:
        raise VerificationError("signature is not 64 bytes")
    problem = envelope_problem(obj)
    if problem:
        raise VerificationError(f"envelope invalid: {problem}")
    return Record(raw, signed_bytes(raw), obj, signature)


SIG_MEMBER = b',"sig":"'
# Where the payload of a canonical record starts: key_id is its only member before it.
PAYLOAD_AT = len(b'{"key_id":"00000000","payload":')
_RUN_ID = re.compile(RUN_ID_PATTERN)
_TIME = re.compile(TIME_PATTERN)
_HEX8 = re.compile(r"[0-9a-f]{8}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def signed_bytes(raw: bytes) -> bytes:
    """The signed bytes of a *canonical* record: the record without its ``sig`` member.

    In canonical JSON the envelope's members are sorted, so ``sig`` sits after ``seq``
    and is never first; removing ``,"sig":"..."`` leaves exactly the canonical JSON of
    the envelope. Member names inside the payload come earlier, and a quote inside any
    string is escaped, so the last occurrence is the envelope's own member.
    """
    start = raw.rfind(SIG_MEMBER)
    if start < 0:
        raise VerificationError("record has no signature")
    end = raw.index(b'"', start + len(SIG_MEMBER))
    return raw[:start] + raw[end + 1 :]


def envelope_problem(obj: dict[str, Any]) -> str | None:
    """Why ``obj`` is not a valid envelope (the rules of EventEnvelope), or None.

    A hand-written check: replay runs it on every event, where a pydantic model
    validation would cost more than the rest of the record parsing.
    """
    run_id, seq, time = obj["run_id"], obj["seq"], obj["time"]
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        return "run_id: not a version 4 UUID"
    if type(seq) is not int or seq < 0:
        return "seq: not a non-negative integer"
    if not isinstance(obj["type"], str):
        return "type: not a string"
    if type(obj["schema_version"]) is not int:
        return "schema_version: not an integer"
    if not isinstance(time, str) or not _TIME.fullmatch(time):
        return "time: not a real UTC time as YYYY-MM-DDTHH:MM:SS.ffffffZ"
    if obj["role"] not in ROLES:
        return f"role: not one of {', '.join(ROLES)}"
    key_id, prev_hash = obj["key_id"], obj["prev_hash"]
    if not isinstance(key_id, str) or not _HEX8.fullmatch(key_id):
        return "key_id: not 8 lower-case hex digits"
    if not isinstance(prev_hash, str) or not _HEX64.fullmatch(prev_hash):
        return "prev_hash: not 64 lower-case hex digits"
    if not isinstance(obj["payload"], dict):
        return "payload: not an object"
    return None
