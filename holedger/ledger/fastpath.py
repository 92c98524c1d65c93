"""The fast path of record parsing, and the compiled patterns of whole records.

:func:`parse_record` takes the fast path where a record has the layout of a canonical
one, and the reference parser (:func:`holedger.ledger.records.parse_record_strict`)
otherwise; :func:`record_pattern` and :func:`checkpoint_pattern` match whole canonical
records of a run at once, for replay's chunk check. None of them accepts a record the
reference parser refuses (tests/ledger/test_fast_parse.py, test_record_pattern.py,
test_checkpoint_pattern.py).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_json

from holedger.ledger.records import PAYLOAD_AT, SIG_MEMBER, Record, parse_record_strict
from holedger.protocol.runs import RUN_ID
from holedger.schemas.canonical import has_long_digits, plain_json
from holedger.schemas.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    TIME_PATTERN,
    Model,
)
from holedger.schemas.recognize import payload_source
from holedger.schemas.types import ROLES


def parse_record(raw: bytes) -> Record:
    """Parse stored record bytes without trusting them: canonical form and shape only.

    Raises VerificationError naming what is wrong. The signature is *not* checked here
    (the verifier must choose the key by role from RunOpened); see ``Record.verify_signature``.
    """
    fast = _parse_fast(raw)
    if fast is not None:
        return fast
    return parse_record_strict(raw)


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
    if at <= PAYLOAD_AT:
        return None
    tail = _TAIL.fullmatch(raw, at)
    if tail is None:
        return None
    prev_hash, role, run_id, version, seq, sig, time, etype = tail.groups()
    payload_bytes = raw[PAYLOAD_AT:at]
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
    rec.signed = raw[: tail.start(_SIG_GROUP) - len(SIG_MEMBER)] + raw[tail.end(_SIG_GROUP) + 1 :]
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
    if not RUN_ID.fullmatch(run_id):
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
    if not RUN_ID.fullmatch(run_id) or not _PLAIN_KEY_NAME.fullmatch(key_name):
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
