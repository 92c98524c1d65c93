"""The fast record parser never accepts what the strict parser refuses, and agrees on the rest.

``parse_record`` tries a fast path first (fixed envelope layout, pydantic-core's JSON
parser) and falls back to the strict reference parser. These tests drive both with
canonical records, hand-made near misses and random mutations, and require: whenever the
fast path accepts, the strict parser accepts too and yields the same envelope, signed
bytes and signature; and canonical records do take the fast path.
"""

from __future__ import annotations

import base64
import random
from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from holedger.errors import SchemaError, VerificationError
from holedger.ledger import fastpath
from holedger.ledger.fastpath import (
    _parse_fast,
    _serialises_canonically,
    parse_record,
    typed_fast_types,
)
from holedger.ledger.keys import SigningKey
from holedger.ledger.records import Record, parse_record_strict, sign_event
from holedger.schemas.canonical import MAX_SAFE_INTEGER
from holedger.schemas.events import EVENT_TYPES, Model
from ledger.attacker import mutate

KEY = SigningKey.from_seed("fast-parse-test", bytes(range(32)))
RUN = "5cc5c15a-c7bd-4381-be43-6f071cd22836"


def make(payload: dict[str, Any], **env: Any) -> Record:
    return sign_event(
        KEY,
        run_id=env.get("run_id", RUN),
        seq=env.get("seq", 7),
        event_type=env.get("event_type", "GatewayCall"),
        role=env.get("role", "gateway"),
        prev_hash=env.get("prev_hash", "ab" * 32),
        payload=payload,
        time="2026-12-01T02:27:05.768341Z",
    )


def agree(raw: bytes) -> Record | None:
    """Run both parsers; return the fast result, failing if it accepts more or differs."""
    fast = _parse_fast(raw)
    try:
        strict: Record | None = parse_record_strict(raw)
    except VerificationError:
        strict = None
    if fast is not None:
        assert strict is not None, f"fast path accepted a record the strict parser refuses: {raw!r}"
        assert fast.envelope == strict.envelope
        assert type(fast.envelope["seq"]) is int
        assert fast.signed == strict.signed
        assert fast.signature == strict.signature
        if fast._typed is not None:  # validated on the fast path: the strict parse agrees
            assert strict.typed_payload() == fast._typed
            assert fast._typed.model_dump(mode="json") == strict.payload
    if strict is None:
        with pytest.raises(VerificationError):
            parse_record(raw)
    else:
        assert parse_record(raw).envelope == strict.envelope
    return fast


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_canonical_records_take_the_fast_path_and_agree(payload: dict[str, Any]) -> None:
    try:
        rec = make(payload)
    except Exception:
        return  # floats, big integers, lone surrogates: refused at signing, nothing to parse
    assert agree(rec.raw) is not None, f"canonical record missed the fast path: {rec.raw!r}"


def test_typical_events_take_the_fast_path() -> None:
    rec = make({"call_id": "c-1", "tokens": {"input": 3, "output": 2}, "note": 'é\n\t"\\ \x01'})
    fast = agree(rec.raw)
    assert fast is not None and fast.payload["note"] == 'é\n\t"\\ \x01'
    for role in ("server", "gateway", "sandbox"):
        assert agree(make({}, role=role, seq=0, event_type="RunOpened").raw) is not None


def _swap(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw, old
    return raw.replace(old, new, 1)


NEAR_MISSES: list[tuple[str, bytes, bytes]] = [
    ("whitespace after colon", b'"a":1', b'"a": 1'),
    ("members out of order", b'"a":1,"b":2', b'"b":2,"a":1'),
    ("duplicate member", b'"a":1,"b":2', b'"a":1,"a":1,"b":2'),
    ("float", b'"a":1', b'"a":1.0'),
    ("exponent", b'"a":1', b'"a":1e2'),
    ("negative zero", b'"a":1', b'"a":-0'),
    ("leading zero", b'"a":1', b'"a":01'),
    ("huge integer", b'"a":1', b'"a":9007199254740993'),
    ("NaN", b'"a":1', b'"a":NaN'),
    ("Infinity", b'"a":1', b'"a":Infinity'),
    ("escaped slash", b'"s":"x/y"', b'"s":"x\\/y"'),
    ("escaped non-ASCII", b'"s":"x/y"', b'"s":"x\\u00e9y"'),
    ("upper-case escape", b'"s":"x/y"', b'"s":"x\\u001Fy"'),
    ("long escape for newline", b'"s":"x/y"', b'"s":"x\\u000ay"'),
    ("lone surrogate", b'"s":"x/y"', b'"s":"x\\ud800y"'),
    ("invalid UTF-8", b'"s":"x/y"', b'"s":"x\xffy"'),
    ("trailing garbage", b'"type":"GatewayCall"}', b'"type":"GatewayCall"} '),
    ("true spelled oddly", b'"t":true', b'"t":True'),
]


@pytest.mark.parametrize(("name", "old", "new"), NEAR_MISSES, ids=[n for n, _, _ in NEAR_MISSES])
def test_near_misses_are_refused_by_both(name: str, old: bytes, new: bytes) -> None:
    rec = make({"a": 1, "b": 2, "s": "x/y", "t": True})
    assert agree(rec.raw) is not None
    mutated = _swap(rec.raw, old, new)
    assert agree(mutated) is None, name
    with pytest.raises(VerificationError):
        parse_record(mutated)


def test_envelope_members_are_checked_on_the_fast_path() -> None:
    rec = make({"a": 1})
    cases = [
        _swap(rec.raw, b'"seq":7', b'"seq":07'),
        _swap(rec.raw, b'"seq":7', b'"seq":-7'),
        _swap(rec.raw, b'"role":"gateway"', b'"role":"optimizer"'),
        _swap(rec.raw, b'"schema_version":1', b'"schema_version":"1"'),
        _swap(rec.raw, b'"time":"2026-12-01T02:27:05.768341Z"', b'"time":"2026-12-01 02:27:05Z"'),
        _swap(rec.raw, RUN.encode(), RUN.upper().encode()),
        rec.raw.replace(b',"sig":"', b',"sig":"A', 1),
    ]
    for raw in cases:
        assert agree(raw) is None


def test_nested_members_named_like_the_envelope_do_not_confuse_it() -> None:
    tricky = {
        "inner": {"prev_hash": "cd" * 32, "role": "server", "sig": "x", "type": "RunClosed"},
        "text": ',"prev_hash":"' + "ef" * 32 + '","role":"server"',
    }
    rec = make(tricky)
    fast = agree(rec.raw)
    assert fast is not None
    assert fast.prev_hash == "ab" * 32 and fast.role == "gateway" and fast.type == "GatewayCall"
    assert fast.payload == tricky


def test_non_canonical_signature_encoding_is_left_to_the_strict_parser() -> None:
    rec = make({"a": 1})
    sig = base64.b64encode(rec.signature)
    last = sig[85:86]
    other = bytes([ord(last) + 1]) if last not in b"/9Z" else b"B"
    mutated = rec.raw.replace(sig, sig[:85] + other + sig[86:])
    assert _parse_fast(mutated) is None
    agree(mutated)


@pytest.mark.parametrize("seed", range(4))
def test_random_mutations_never_widen_acceptance(seed: int) -> None:
    rng = random.Random(seed)
    base = make({"n": 12, "s": 'a\\b"c', "l": [1, "x", None, {"k": False}], "d": {"z": 0}}).raw
    alphabet = b'{}[]",:0123456789.eE-+ \\/abtrufnl\x00\xc3\xa9'
    accepted = 0
    for _ in range(1500):
        if agree(mutate(rng, base, alphabet)) is not None:
            accepted += 1
    # Most mutations break the record; the few accepted ones were checked by agree().
    assert accepted < 1500


def test_integer_bounds() -> None:
    ok = make({"a": MAX_SAFE_INTEGER, "b": -MAX_SAFE_INTEGER})
    assert agree(ok.raw) is not None
    big = _swap(ok.raw, str(MAX_SAFE_INTEGER).encode(), str(MAX_SAFE_INTEGER + 1).encode())
    assert agree(big) is None


# ---------------------------------------------------------------- the typed fast path
#
# For event types whose models can only serialise to canonical JSON, the fast path
# validates the payload straight into its model and compares the re-serialised bytes.

CALL: dict[str, Any] = {
    "allowed": True,
    "attempt": 0,
    "budget": {
        "cap": 1000000,
        "outstanding": 0,
        "reservations": 12,
        "settled": 10896,
        "settled_calls": 12,
        "trial_cap": None,
        "trial_outstanding": 0,
        "trial_settled": 0,
    },
    "call_id": "call-12",
    "case_id": "case-2",
    "latency_ms": 41,
    "model_requested": "sim-small",
    "model_served": "sim-small",
    "request_digest": "ab" * 32,
    "request_id": "req-0",
    "reservation_index": 12,
    "reserved": 2048,
    "response_digest": "cd" * 32,
    "scope": "target",
    "status": 200,
    "tokens": {"cached": 128, "input": 812, "output": 96, "reasoning": 0, "total": 908},
    "trial_id": "trial-4",
}


def call_record() -> Record:
    payload = EVENT_TYPES["GatewayCall"].model_validate(CALL).model_dump(mode="json")
    return make(payload)


def test_hot_event_types_are_checked_by_validation() -> None:
    assert {"GatewayCall", "Checkpoint", "CandidateCommitted"} <= set(typed_fast_types())
    fast = agree(call_record().raw)
    assert fast is not None and fast._typed is not None
    assert fast.typed_payload() is fast._typed
    assert fast.payload == fast._typed.model_dump(mode="json")


TYPED_NEAR_MISSES: list[tuple[str, bytes, bytes]] = [
    (
        "nested members out of order",
        b'"cap":1000000,"outstanding":0',
        b'"outstanding":0,"cap":1000000',
    ),
    ("members out of order", b'"allowed":true,"attempt":0', b'"attempt":0,"allowed":true'),
    ("float for an integer", b'"status":200', b'"status":200.0'),
    ("exponent for an integer", b'"status":200', b'"status":2e2'),
    ("integer beyond 2**53 - 1", b'"reserved":2048', b'"reserved":9007199254740993'),
    ("escaped character", b'"sim-small"', b'"sim\\u002dsmall"'),
    ("duplicate member", b'"status":200', b'"status":200,"status":200'),
    ("whitespace", b'"status":200', b'"status": 200'),
]


@pytest.mark.parametrize(
    ("name", "old", "new"), TYPED_NEAR_MISSES, ids=[n for n, _, _ in TYPED_NEAR_MISSES]
)
def test_typed_near_misses_are_refused_by_both(name: str, old: bytes, new: bytes) -> None:
    mutated = _swap(call_record().raw, old, new)
    assert agree(mutated) is None, name


INVALID_PAYLOADS: list[tuple[str, bytes, bytes]] = [
    ("unknown member", b'"allowed":true', b'"aaa":1,"allowed":true'),
    ("upper-case digest", b'"request_digest":"abab', b'"request_digest":"ABab'),
    ("negative reservation", b'"reserved":2048', b'"reserved":-1'),
    ("unknown scope", b'"scope":"target"', b'"scope":"judge"'),
    ("missing member", b'"call_id":"call-12",', b""),
]


@pytest.mark.parametrize(
    ("name", "old", "new"), INVALID_PAYLOADS, ids=[n for n, _, _ in INVALID_PAYLOADS]
)
def test_canonical_but_invalid_payloads_fail_the_schema_check(
    name: str, old: bytes, new: bytes
) -> None:
    mutated = _swap(call_record().raw, old, new)
    fast = agree(mutated)
    assert fast is not None, name  # still canonical JSON: the record parses ...
    assert fast._typed is None  # ... but the typed path did not vouch for the payload
    with pytest.raises(SchemaError):
        fast.typed_payload()


def test_an_omitted_default_is_valid_but_not_taken_as_canonical_by_the_typed_path() -> None:
    mutated = _swap(call_record().raw, b'"stream":false,', b"")
    fast = agree(mutated)
    assert fast is not None and fast._typed is None
    assert fast.typed_payload() == parse_record_strict(mutated).typed_payload()


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.integers(-(2**60), 2**60),
    st.text(max_size=10),
    st.sampled_from(["reserved", "status", "latency_ms", "attempt"]),
)
def test_typed_payload_values_agree(number: int, text: str, field: str) -> None:
    payload = dict(CALL, call_id=text)
    payload[field] = number
    try:
        rec = make(EVENT_TYPES["GatewayCall"].model_validate(payload).model_dump(mode="json"))
    except Exception:
        return  # refused at signing (out of range, lone surrogate) or invalid
    agree(rec.raw)


def _all_models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [Model]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_model_declares_its_fields_in_canonical_order() -> None:
    models = [m for m in _all_models() if m.__module__.startswith("holedger.")]
    assert len(models) > 20
    for model in models:
        own = [name for name in model.model_fields if name in model.__annotations__]
        assert own == sorted(own), model.__name__


def test_models_that_cannot_prove_canonical_bytes_are_left_to_the_untyped_path() -> None:
    class WithDict(Model):
        limits: dict[str, int]

    class WithFloat(Model):
        x: float

    class WithAny(Model):
        x: Any

    class Unsorted(BaseModel):
        b: int
        a: int

    class Open(Model):
        model_config = ConfigDict(extra="allow")
        text: str

    class Inner(Model):
        model_config = ConfigDict(extra="allow")
        n: int

    class OpenInside(Model):
        inner: Inner

    class Fine(Model):
        b: int
        a: str | None = None
        keys: list[str] = Field(default_factory=list)

    for model in (WithDict, WithFloat, WithAny, Unsorted, Open, OpenInside):
        assert not _serialises_canonically(model.__pydantic_core_schema__), model.__name__
    assert _serialises_canonically(Fine.__pydantic_core_schema__)


def test_free_form_members_out_of_order_are_refused() -> None:
    trial = {
        "answer_digest": None,
        "attempt": 0,
        "backend": "bwrap",
        "candidate": "0" * 40,
        "case_id": "c1",
        "exit_status": 0,
        "gateway_calls": 1,
        "isolation": "isolated",
        "limits": {"cpu_s": 30, "memory_mb": 512},
        "oom": False,
        "output_digest": None,
        "request_id": "r1",
        "score": "0.5",
        "split": "dev",
        "timed_out": False,
        "tokens": {"cached": 0, "input": 1, "output": 1, "reasoning": 0, "total": 2},
        "trace_digest": None,
        "trial_id": "t1",
        "wall_ms": 5,
    }
    payload = EVENT_TYPES["TrialCompleted"].model_validate(trial).model_dump(mode="json")
    rec = make(payload, event_type="TrialCompleted", role="sandbox")
    assert agree(rec.raw) is not None
    mutated = _swap(rec.raw, b'"cpu_s":30,"memory_mb":512', b'"memory_mb":512,"cpu_s":30')
    assert agree(mutated) is None
    closed = make(
        {"reason": "completed", "summary": {"a": 1, "b": 2}}, event_type="RunClosed", role="server"
    )
    assert agree(closed.raw) is not None
    assert agree(_swap(closed.raw, b'"a":1,"b":2', b'"b":2,"a":1')) is None


def test_a_value_its_serialiser_does_not_expect_is_not_taken_as_canonical(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A validator may hand a field's serialiser a value of another type (here a float for
    an int); the serialiser would write it as it is, so the typed path must refuse it."""

    class Odd(Model):
        n: Annotated[int, AfterValidator(float)]

    assert _serialises_canonically(Odd.__pydantic_core_schema__)
    monkeypatch.setitem(EVENT_TYPES, "Odd", Odd)
    monkeypatch.setattr(fastpath, "_TYPED_MODELS", None)
    assert "Odd" in typed_fast_types()
    rec = make({"n": 1}, event_type="Odd")
    mutated = _swap(rec.raw, b'"n":1', b'"n":1.0')
    assert _parse_fast(mutated) is None
    assert agree(mutated) is None
