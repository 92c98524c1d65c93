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
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_json

from holedger.errors import CanonicalError, SchemaError, VerificationError
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.schemas.canonical import (
    b64decode_strict,
    canonical_json,
    has_long_digits,
    parse_canonical,
    plain_json,
)
from holedger.schemas.events import (
    EVENT_TYPES,
    RUN_ID_PATTERN,
    SCHEMA_VERSION,
    TIME_PATTERN,
    EventEnvelope,
    Model,
)
from holedger.schemas.recognize import payload_source
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
            parsed = from_json(self.raw[_PAYLOAD_AT : self._payload_end])
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


def parse_record(raw: bytes) -> Record:
    """Parse stored record bytes without trusting them: canonical form and shape only.

    Raises VerificationError naming what is wrong. The signature is *not* checked here
    (the verifier must choose the key by role from RunOpened); see ``Record.verify_signature``.
    """
    fast = _parse_fast(raw)
    if fast is not None:
        return fast
    return _parse_strict(raw)


def _parse_strict(raw: bytes) -> Record:
    """The reference parser: strict JSON, re-encoded and compared; names every problem."""
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


_SIG_MEMBER = b',"sig":"'
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
    start = raw.rfind(_SIG_MEMBER)
    if start < 0:
        raise VerificationError("record has no signature")
    end = raw.index(b'"', start + len(_SIG_MEMBER))
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


# ------------------------------------------------------------------ the fast path
#
# A canonical record has a fixed layout: its members sorted, "key_id" first, then
# "payload", then members whose values come from small alphabets that need no escaping:
#
#   {"key_id":"<8 hex>","payload":<P>,"prev_hash":"<64 hex>","role":"<role>",
#    "run_id":"<uuid4>","schema_version":<int>,"seq":<int>,"sig":"<base64>",
#    "time":"<time>","type":"<name>"}
#
# So the record is canonical exactly when P is the canonical JSON of an object. The fast
# path matches the envelope's bytes with two patterns and then checks P one of two ways:
#
# * typed: for an event type whose model can only serialise to canonical JSON (fields in
#   code-point order, see schemas.events.Model; only strings, exact integers, booleans,
#   null, literals, lists and nested such models; no free-form dicts), P is validated
#   straight into the model, re-serialised and compared byte for byte: equal bytes prove
#   P canonical and valid at once. Only integers beyond 2**53 - 1, which a model happily
#   round-trips, need a separate (cheap) test;
# * untyped: P is parsed with pydantic-core's JSON parser, re-encoded (member order as
#   parsed) and compared, plus a walk for what a byte comparison cannot see: member names
#   out of order, floats, integers beyond 2**53 - 1.
#
# Anything it does not accept goes to the strict parser, which accepts or refuses it with
# a precise reason; the fast path only ever accepts records the strict parser accepts too,
# and a payload it validated is the one the strict parser's record validates to
# (tests/ledger/test_fast_parse.py).

# The time member's value, as the envelope model's TIME_PATTERN spells it (no anchors).
_TIME_BYTES = TIME_PATTERN.removeprefix("^").removesuffix("$").encode()

_HEAD = re.compile(rb'\{"key_id":"[0-9a-f]{8}","payload":\{')
_KEY_ID = slice(len(b'{"key_id":"'), len(b'{"key_id":"00000000'))
_PAYLOAD_AT = len(b'{"key_id":"00000000","payload":')
_TAIL_AT = b',"prev_hash":"'
_TAIL = re.compile(
    rb',"prev_hash":"([0-9a-f]{64})","role":"(' + "|".join(ROLES).encode() + rb')",'
    rb'"run_id":"([0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12})",'
    rb'"schema_version":(0|[1-9][0-9]{0,14}),"seq":(0|[1-9][0-9]{0,14}),'
    rb'"sig":"([A-Za-z0-9+/]{85}[AQgw]==)",'
    rb'"time":"(' + _TIME_BYTES + rb')",'
    rb'"type":"([A-Za-z][A-Za-z0-9]{0,63})"\}'
)
_SIG_GROUP = 6


def _parse_fast(raw: bytes) -> Record | None:
    if _HEAD.match(raw) is None:
        return None
    at = raw.rfind(_TAIL_AT)
    if at <= _PAYLOAD_AT:
        return None
    tail = _TAIL.fullmatch(raw, at)
    if tail is None:
        return None
    prev_hash, role, run_id, version, seq, sig, time, etype = tail.groups()
    payload_bytes = raw[_PAYLOAD_AT:at]
    typed = _typed_payload(etype, version, payload_bytes)
    payload: dict[str, Any] | None = None
    if typed is None:
        try:
            parsed = from_json(payload_bytes, allow_inf_nan=False, cache_strings="keys")
        except ValueError:
            return None
        if type(parsed) is not dict or not plain_json(parsed, 1, ordered=True):
            return None
        if to_json(parsed) != payload_bytes:
            return None
        payload = parsed
    rec = Record.__new__(Record)
    rec.raw = raw
    rec.signed = raw[: tail.start(_SIG_GROUP) - len(_SIG_MEMBER)] + raw[tail.end(_SIG_GROUP) + 1 :]
    rec.signature = binascii.a2b_base64(sig)
    rec._envelope = None
    rec.run_id = run_id.decode()
    rec.seq = int(seq)
    rec.type = etype.decode()
    rec.role = role.decode()
    rec.key_id = raw[_KEY_ID].decode()
    rec.prev_hash = prev_hash.decode()
    rec.schema_version = int(version)
    rec.time = time.decode()
    rec._payload = payload
    rec._payload_end = at
    rec._typed = typed
    return rec


def record_pattern(
    run_id: str, digests: Mapping[str, Sequence[str]], types: Collection[str]
) -> tuple[re.Pattern[bytes], list[tuple[str, str]]] | None:
    """One pattern for the canonical records of run ``run_id`` of the event ``types``
    whose payload schemas.recognize recognises as valid and canonical for its type's
    model, and the blob fields it reads; None when none of the types is recognised.

    Whatever it matches, ``parse_record`` accepts too, with the same envelope values and
    a payload valid for the type's model (tests/ledger/test_record_pattern.py): each
    recognised type's payload is one alternative, and the record's ``type`` member must
    name the type of the alternative that matched (a conditional on its group). Named
    groups: ``_key_id``, ``_prev_hash``, ``_role``, ``_seq``, ``_sig`` and ``_type`` (the
    envelope's), and ``_b0``, ``_b1``, ... for the payload fields named in ``digests``
    (event type -> field names), in the order of the returned list of (type, field): each
    is the field's JSON value (``null`` or a quoted string), or None in a record of
    another type.
    """
    if not _RUN_ID.fullmatch(run_id):
        return None
    payloads: list[bytes] = []
    names: list[bytes] = []
    blobs: list[tuple[str, str]] = []
    for event_type, model in EVENT_TYPES.items():
        if event_type not in types:
            continue
        fields = tuple(digests.get(event_type, ()))
        missing = set(fields) - set(model.model_fields)
        if missing:
            raise ValueError(f"{event_type} has no field {sorted(missing)[0]!r}")
        source = payload_source(model, fields)
        if source is None or not _TYPE_NAME.fullmatch(event_type):
            continue
        for field in fields:  # the field's group gets a name unique to the whole pattern
            group = f"_b{len(blobs)}".encode()
            named = b"(?P<" + field.encode() + b">"
            if source.count(named) != 1:
                raise ValueError(f"the {event_type} pattern has no one group for {field!r}")
            source = source.replace(named, b"(?P<" + group + b">")
            blobs.append((event_type, field))
        payloads.append(b"(?P<_p" + str(len(payloads)).encode() + b">" + source + b")")
        names.append(event_type.encode())
    if not payloads:
        return None
    # "type" must be the name of the payload alternative that matched: (?(_p0)A|(?(_p1)B|...))
    type_name = names[-1]
    for index in range(len(names) - 2, -1, -1):
        type_name = b"(?(_p" + str(index).encode() + b")" + names[index] + b"|" + type_name + b")"
    pattern = re.compile(
        rb'\{"key_id":"(?P<_key_id>[0-9a-f]{8})","payload":(?:'
        + b"|".join(payloads)
        + rb'),"prev_hash":"(?P<_prev_hash>[0-9a-f]{64})",'
        + rb'"role":"(?P<_role>'
        + "|".join(ROLES).encode()
        + rb')",'
        + b'"run_id":"'
        + run_id.encode()
        + b'",'
        + b'"schema_version":'
        + _SCHEMA_VERSION_BYTES
        + b","
        + rb'"seq":(?P<_seq>0|[1-9][0-9]{0,14}),'
        + rb'"sig":"(?P<_sig>[A-Za-z0-9+/]{85}[AQgw]==)",'
        + b'"time":"'
        + _TIME_BYTES
        + b'",'
        + b'"type":"(?P<_type>'
        + type_name
        + rb')"\}'
    )
    return pattern, blobs


_TYPE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")

# Key names a checkpoint pattern spells literally: none that JSON would escape.
_PLAIN_KEY_NAME = re.compile(r"[A-Za-z0-9._:/@=-]{1,128}")
_PLAIN_ORIGIN = re.compile(r"[A-Za-z0-9._:/@-]{1,256}")
# Standard base64 of 32 and of 68 bytes, in the one encoding with zero padding bits.
_B64_32 = rb"[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]="
_B64_68 = rb"[A-Za-z0-9+/]{90}[AEIMQUYcgkosw048]="


def checkpoint_pattern(run_id: str, origin: str, key_name: str) -> re.Pattern[bytes] | None:
    """One pattern for the canonical Checkpoint records of run ``run_id`` whose note is a
    tlog-checkpoint of ``origin`` with no extension lines and one signature, by the key
    named ``key_name``: as holedger writes them. None when ``run_id``, ``origin`` or
    ``key_name`` is not one it spells literally.

    Whatever it matches, ``parse_record`` accepts too, with a Checkpoint payload and the
    same envelope values, and the note parses (c2sp signed-note, tlog-checkpoint) to the
    text and the one signature line the groups read (tests/ledger/test_checkpoint_pattern.py).
    It checks nothing the groups must agree on: that is the caller's. Named groups:
    ``_key_id``, ``_prev_hash``, ``_role``, ``_seq``, ``_sig`` and ``_type`` (the
    envelope's, as in ``record_pattern``); ``_size`` and ``_root`` (the payload's);
    ``_text`` (the note text, JSON-encoded: its newlines are the two bytes ``\\n``),
    ``_text_size`` and ``_text_root`` (its size and base64 root lines) and ``_note_sig``
    (base64 of the signature line's key id and signature).
    """
    if not _RUN_ID.fullmatch(run_id) or not _PLAIN_KEY_NAME.fullmatch(key_name):
        return None
    if not _PLAIN_ORIGIN.fullmatch(origin):
        return None
    number = rb"0|[1-9][0-9]{0,14}"
    newline = rb"\\n"  # a newline inside a JSON string
    return re.compile(
        rb'\{"key_id":"(?P<_key_id>[0-9a-f]{8})","payload":\{"note":"'
        + b"(?P<_text>"
        + re.escape(origin.encode())
        + newline
        + b"(?P<_text_size>"
        + number
        + b")"
        + newline
        + b"(?P<_text_root>"
        + _B64_32
        + b")"
        + newline
        + b")"
        + newline
        + "\u2014 ".encode()
        + re.escape(key_name.encode())
        + b" (?P<_note_sig>"
        + _B64_68
        + b")"
        + newline
        + rb'","root":"(?P<_root>[0-9a-f]{64})","size":(?P<_size>'
        + number
        + rb')\},"prev_hash":"(?P<_prev_hash>[0-9a-f]{64})","role":"(?P<_role>server)",'
        + b'"run_id":"'
        + run_id.encode()
        + b'","schema_version":'
        + _SCHEMA_VERSION_BYTES
        + b',"seq":(?P<_seq>'
        + number
        + rb'),"sig":"(?P<_sig>[A-Za-z0-9+/]{85}[AQgw]==)",'
        + b'"time":"'
        + _TIME_BYTES
        + rb'","type":"(?P<_type>Checkpoint)"\}'
    )


def _typed_payload(etype: bytes, version: bytes, payload_bytes: bytes) -> Model | None:
    """The payload validated into its model when that also proves it canonical, else None."""
    model = _typed_models().get(etype)
    if model is None or version != _SCHEMA_VERSION_BYTES or has_long_digits(payload_bytes):
        return None
    try:
        obj = model.model_validate_json(payload_bytes)
        # warnings="error": a value its field's serialiser does not expect (a validator
        # that returned a float for an int field, say) fails instead of being written.
        if model.__pydantic_serializer__.to_json(obj, warnings="error") == payload_bytes:
            return obj
    except (ValidationError, PydanticSerializationError, ValueError):
        pass
    return None


_SCHEMA_VERSION_BYTES = str(SCHEMA_VERSION).encode()
_TYPED_MODELS: dict[bytes, type[Model]] | None = None

# Core-schema node types whose serialisation is canonical JSON of the validated value:
# anything else (free-form dicts, Any, floats, unions, custom serialisers, ...) keeps a
# type on the untyped path.
_CANONICAL_NODES = frozenset(
    {
        "bool",
        "default",
        "definition-ref",
        "definitions",
        "function-after",
        "function-before",
        "int",
        "is-instance",
        "json-or-python",
        "lax-or-strict",
        "list",
        "literal",
        "model",
        "model-field",
        "model-fields",
        "nullable",
        "str",
    }
)


def _typed_models() -> dict[bytes, type[Model]]:
    global _TYPED_MODELS
    if _TYPED_MODELS is None:
        _TYPED_MODELS = {
            name.encode(): model
            for name, model in EVENT_TYPES.items()
            if _serialises_canonically(model.__pydantic_core_schema__)
        }
    return _TYPED_MODELS


def typed_fast_types() -> list[str]:
    """The event types whose payloads the fast path checks by validating (for tests)."""
    return sorted(name.decode() for name in _typed_models())


def _serialises_canonically(node: object) -> bool:
    """True when every value a core schema validates serialises as canonical JSON."""
    if isinstance(node, list):
        return all(_serialises_canonically(item) for item in node)
    if not isinstance(node, dict):
        return True
    kind = node.get("type")
    if isinstance(kind, str) and kind not in _CANONICAL_NODES:
        return False
    if kind == "model" and node.get("root_model"):
        return False
    config = node.get("config")
    if isinstance(config, dict) and (
        config.get("extra_fields_behavior") == "allow" or config.get("serialize_by_alias")
    ):
        return False  # extra members would be serialised as they came, unchecked
    if node.get("extra_behavior") == "allow":
        return False
    if kind == "model-fields":
        fields = node.get("fields", {})
        if list(fields) != sorted(fields) or node.get("computed_fields"):
            return False
        if any(
            f.get("serialization_alias") or f.get("serialization_exclude") for f in fields.values()
        ):
            return False
    serialization = node.get("serialization")
    if serialization is not None and not _string_serializer(serialization):
        return False
    return all(
        _serialises_canonically(value) for key, value in node.items() if key not in _NOT_SCHEMA
    )


# Members of a core-schema node that hold data, not schemas.
_NOT_SCHEMA = frozenset(
    {
        "cls",
        "config",
        "default",
        "expected",
        "json_schema_input_schema",
        "metadata",
        "serialization",
        "function",
    }
)


def _string_serializer(serialization: dict[str, Any]) -> bool:
    """A custom serialiser is admitted only when it produces a string (exact rationals)."""
    kind = serialization.get("type")
    if kind == "to-string":
        return True
    return kind == "function-plain" and serialization.get("return_schema") == {"type": "str"}
