"""The record pattern accepts nothing the reference parser refuses, and reads the same values.

``fastpath.record_pattern`` (built from ``schemas.recognize``) lets replay's chunk path
accept a record, envelope and payload, with one regular expression instead of parsing it.
That is sound only if every record it matches is one ``parse_record`` accepts, whose
payload its model validates, with the very envelope values, signature, signed bytes and
blob digests the pattern reads. These tests drive the pattern with payloads generated from
each recognised model's own schema (valid ones, and deliberately invalid ones: wrong
types, bounds, members missing or extra, strings that need escaping), with hand-made near
misses and with random byte mutations, and check that agreement on every record.
"""

from __future__ import annotations

import base64
import random
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holedger.errors import CanonicalError, SchemaError, VerificationError
from holedger.ledger.fastpath import record_pattern
from holedger.ledger.keys import SigningKey
from holedger.ledger.records import parse_record_strict, sign_envelope
from holedger.replay.chunks import BLOB_FIELDS
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import EVENT_TYPES
from holedger.schemas.recognize import payload_pattern
from ledger.attacker import mutate

KEY = SigningKey.from_seed("record-pattern-test", bytes(range(32)))
RUN = "5cc5c15a-c7bd-4381-be43-6f071cd22836"
FOUND = record_pattern(RUN, BLOB_FIELDS, EVENT_TYPES)
assert FOUND is not None
PATTERN, BLOBS = FOUND
RECOGNISED = sorted(name for name, model in EVENT_TYPES.items() if payload_pattern(model))


def envelope(event_type: str, payload: dict[str, Any], **changes: Any) -> dict[str, Any]:
    env = {
        "key_id": KEY.key_id_hex,
        "payload": payload,
        "prev_hash": "ab" * 32,
        "role": "gateway",
        "run_id": RUN,
        "schema_version": 1,
        "seq": 7,
        "time": "2026-12-01T02:27:05.768341Z",
        "type": event_type,
    }
    env.update(changes)
    return env


def signed_record(env: dict[str, Any]) -> bytes | None:
    """The record of ``env`` signed as is (no validation), or None if it has no canonical
    JSON (a float, an integer beyond 2**53)."""
    try:
        return sign_envelope(KEY, env, canonical_json(env)).raw
    except (CanonicalError, ValueError, TypeError):
        return None


def agree(raw: bytes) -> bool:
    """Whether the pattern matches; when it does, the reference parser must accept the
    record, its payload must validate, and every value the pattern reads must be the
    parser's."""
    match = PATTERN.fullmatch(raw)
    if match is None:
        return False
    try:
        rec = parse_record_strict(raw)
        payload = rec.typed_payload()
    except (VerificationError, SchemaError) as exc:
        raise AssertionError(f"matched a record the parser refuses ({exc}): {raw!r}") from exc
    assert match.group("_key_id").decode() == rec.key_id
    assert match.group("_prev_hash").decode() == rec.prev_hash
    assert match.group("_role").decode() == rec.role
    assert int(match.group("_seq")) == rec.seq and match.group("_seq") == str(rec.seq).encode()
    assert match.group("_type").decode() == rec.type
    start, end = match.span("_sig")
    assert base64.b64decode(raw[start:end]) == rec.signature
    assert raw[: start - 8] + raw[end + 1 :] == rec.signed
    assert payload.model_dump(mode="json") == rec.payload
    for number, (etype, field) in enumerate(BLOBS):
        value = match.group(f"_b{number}")
        if etype == rec.type:
            assert value == canonical_json(rec.payload[field]), (etype, field)
        else:
            assert value is None
    return True


# ---------------------------------------------------------------- values from the schemas

PLAIN = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=8)
AWKWARD = st.sampled_from(['a"b', "a\\b", "line\nbreak", "tab\t", "é", "\x7f", "\x00", "/"])
EDGE_INTS = st.sampled_from([-1, 2**53 - 1, 2**53, 10**15 - 1, 10**15, -(10**15), 10**16])
WRONG = st.none() | st.booleans() | EDGE_INTS | PLAIN | AWKWARD | st.just([]) | st.just({})


def valid(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values a core-schema node accepts (strings printable ASCII, integers small)."""
    kind = node.get("type")
    if kind == "model":
        return valid(node["schema"])
    if kind == "model-fields":
        return st.fixed_dictionaries({name: valid(f) for name, f in node["fields"].items()})
    if kind in ("model-field", "default"):
        return valid(node["schema"])
    if kind == "nullable":
        return st.none() | valid(node["schema"])
    if kind == "str":
        return PLAIN
    if kind == "int":
        return st.integers(0, 10**6) | st.integers(-5, 5)
    if kind == "bool":
        return st.booleans()
    if kind == "literal":
        return st.sampled_from(node["expected"])
    if kind == "list":
        return st.lists(valid(node["items_schema"]), max_size=3)
    if kind == "function-before":  # the exact hex-string validators
        return st.integers(0, 2**256 - 1).map(lambda n: f"{n:064x}") | st.integers(
            0, 2**32 - 1
        ).map(lambda n: f"{n:08x}")
    return WRONG


@st.composite
def payloads(draw: st.DrawFn, model: Any) -> dict[str, Any]:
    """A payload that is valid, or valid but for one to three corruptions anywhere in it:
    a value replaced by one of another type, out of bounds or needing escapes, a member
    dropped or an unknown one added."""
    payload = draw(valid(model.__pydantic_core_schema__))
    for _ in range(draw(st.integers(0, 3))):
        parent, key = _pick(draw, payload)
        if parent is None:
            break
        action = draw(st.sampled_from(["replace", "awkward", "drop", "add"]))
        if action == "replace":
            parent[key] = draw(WRONG)
        elif action == "awkward":
            parent[key] = draw(AWKWARD | EDGE_INTS)
        elif action == "drop" and isinstance(parent, dict):
            del parent[key]
        elif isinstance(parent, dict):
            parent["zzz_extra"] = draw(WRONG)
    return payload


def _pick(draw: st.DrawFn, value: Any) -> tuple[Any, Any]:
    """A (container, key) somewhere in ``value``, chosen at random."""
    places: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in list(items):
            places.append((node, key))
            if isinstance(child, dict | list):
                walk(child)

    walk(value)
    return draw(st.sampled_from(places)) if places else (None, None)


@pytest.mark.parametrize("event_type", RECOGNISED)
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_generated_payloads(event_type: str, data: st.DataObject) -> None:
    model = EVENT_TYPES[event_type]
    payload = data.draw(payloads(model))
    role = data.draw(st.sampled_from(["server", "gateway", "sandbox"]))
    raw = signed_record(envelope(event_type, payload, role=role))
    if raw is None:
        return
    matched = agree(raw)
    try:
        # as replay validates (strict), compared as bytes (in Python, False == 0)
        dumped = model.model_validate(payload, strict=True).model_dump(mode="json")
        ok = canonical_json(dumped) == canonical_json(payload)
    except Exception:
        ok = False
    if matched:
        assert ok
    if ok and _plain(payload) and set(payload) == set(model.model_fields):
        # What holedger itself writes (every field, no escapes) must take the fast path.
        assert matched, f"a canonical valid {event_type} record was not recognised: {raw!r}"


def _plain(value: Any) -> bool:
    if isinstance(value, str):
        return re.fullmatch(r"[\x20\x21\x23-\x5b\x5d-\x7e]*", value) is not None
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return abs(value) < 10**15
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return False


# ---------------------------------------------------------------- near misses

CALL: dict[str, Any] = (
    EVENT_TYPES["GatewayCall"]
    .model_validate(
        {
            "allowed": True,
            "attempt": 0,
            "call_id": "call-12",
            "case_id": "case-2",
            "latency_ms": 41,
            "model_requested": "sim-small",
            "model_served": "sim-small",
            "request_digest": "ab" * 32,
            "request_id": "req-0",
            "reserved": 2048,
            "response_digest": None,
            "scope": "target",
            "status": 200,
            "tokens": {"cached": 128, "input": 812, "output": 96, "reasoning": 0, "total": 908},
            "trial_id": "trial-4",
        }
    )
    .model_dump(mode="json")
)


def test_what_holedger_writes_is_recognised() -> None:
    """GatewayCall, the bulk of a run, must stay recognised (else replay slows down)."""
    assert {"GatewayCall", "SafetyViolation", "CandidateNominated"} <= set(RECOGNISED)
    raw = signed_record(envelope("GatewayCall", CALL))
    assert raw is not None and agree(raw)
    match = PATTERN.fullmatch(raw)
    assert match is not None
    number = BLOBS.index(("GatewayCall", "request_digest"))
    assert match.group(f"_b{number}") == b'"' + b"ab" * 32 + b'"'


def _swap(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw, old
    return raw.replace(old, new, 1)


NEAR_MISSES: list[tuple[str, bytes, bytes]] = [
    ("type of another recognised payload", b'"type":"GatewayCall"', b'"type":"CandidateNominated"'),
    ("unknown type", b'"type":"GatewayCall"', b'"type":"GatewayCalls"'),
    ("schema version 2", b'"schema_version":1', b'"schema_version":2'),
    ("another run", RUN.encode(), RUN.replace("5", "6").encode()),
    ("role unknown", b'"role":"gateway"', b'"role":"optimizer"'),
    ("seq with a leading zero", b'"seq":7', b'"seq":07'),
    ("negative where ge=0", b'"latency_ms":41', b'"latency_ms":-41'),
    ("leading zero where ge=0", b'"latency_ms":41', b'"latency_ms":041'),
    ("leading zero", b'"attempt":0', b'"attempt":00'),
    ("negative zero", b'"attempt":0', b'"attempt":-0'),
    ("sixteen digits", b'"latency_ms":41', b'"latency_ms":1000000000000041'),
    ("a float", b'"latency_ms":41', b'"latency_ms":41.0'),
    ("an integer as a string", b'"latency_ms":41', b'"latency_ms":"41"'),
    ("null where not nullable", b'"status":200', b'"status":null'),
    ("a literal not allowed", b'"scope":"target"', b'"scope":"other"'),
    ("upper-case hex digest", b'"request_digest":"abab', b'"request_digest":"ABab'),
    ("short digest", b'"request_digest":"abab', b'"request_digest":"ab'),
    ("escaped character", b'"call_id":"call-12"', b'"call_id":"call\\u002d12"'),
    ("non-ASCII", b'"call_id":"call-12"', b'"call_id":"call\xc3\xa912"'),
    ("member missing", b'"attempt":0,', b""),
    ("member extra", b'"allowed":true,', b'"allowed":true,"zzz":1,'),
    ("members out of order", b'"allowed":true,"attempt":0,', b'"attempt":0,"allowed":true,'),
    ("whitespace", b'"allowed":true', b'"allowed": true'),
    ("True", b'"allowed":true', b'"allowed":True'),
    ("time without microseconds", b'.768341Z"', b'Z"'),
    ("non-canonical signature end", b'==","time"', b'=","time"'),
    ("trailing byte", b'"GatewayCall"}', b'"GatewayCall"} '),
]


@pytest.mark.parametrize(("name", "old", "new"), NEAR_MISSES, ids=[n for n, _, _ in NEAR_MISSES])
def test_near_misses_are_not_matched(name: str, old: bytes, new: bytes) -> None:
    raw = signed_record(envelope("GatewayCall", CALL))
    assert raw is not None and agree(raw)
    assert not agree(_swap(raw, old, new)), name


def test_non_canonical_signature_encoding_is_not_matched() -> None:
    raw = signed_record(envelope("GatewayCall", CALL))
    assert raw is not None
    start = raw.rindex(b',"sig":"') + 8
    last = raw[start + 85 : start + 86]
    # The last character holds 2 bits of the signature and 4 zero padding bits (A, Q, g
    # or w); the next character has the same 2 bits and non-zero padding.
    other = bytes([last[0] + 1])
    assert not agree(raw[: start + 85] + other + raw[start + 86 :])


@pytest.mark.parametrize("seed", range(3))
def test_random_mutations_never_widen_acceptance(seed: int) -> None:
    rng = random.Random(seed)
    bases = [
        signed_record(envelope("GatewayCall", CALL)),
        signed_record(envelope("CandidateNominated", {"candidate": "0" * 40}, role="server")),
        signed_record(
            envelope(
                "SafetyViolation",
                {
                    "call_id": None,
                    "category": "timeout",
                    "detail": "trial exceeded 60 s",
                    "evidence_digest": "cd" * 32,
                    "trial_id": "t-1",
                },
                role="sandbox",
            )
        ),
    ]
    alphabet = b'{}[]",:0123456789.eE-+ \\/abtrufnlGC\x00\xc3\xa9'
    accepted = 0
    for _ in range(1500):
        base = rng.choice(bases)
        assert base is not None
        accepted += agree(mutate(rng, base, alphabet))
    assert accepted < 1500  # most mutations break the record; agree() checked the rest
