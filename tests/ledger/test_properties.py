"""Property-based tests: canonical JSON, exact rationals, signed records, the chain, Merkle.

Hypothesis generates the values; each property names what it guarantees.
"""

from __future__ import annotations

import base64
import hashlib
import json
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holedger.errors import CanonicalError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey
from holedger.ledger.merkle import MerkleFrontier, leaf_hash, root_from_leaf_hashes
from holedger.ledger.records import record_bytes, sign_event, signed_bytes
from holedger.replay.runs import verify_records
from holedger.schemas.canonical import (
    MAX_SAFE_INTEGER,
    canonical_json,
    parse_canonical,
    parse_json,
    rational_to_str,
    str_to_rational,
)
from holedger.schemas.types import RATIONAL_PATTERN, ZERO_HASH

KEY = SigningKey.from_seed("holedger-operator", bytes(range(32)))
RUN_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"

ints = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
scalars = st.none() | st.booleans() | ints | texts
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)
objects = st.dictionaries(texts, json_values, max_size=6)


# ---------------------------------------------------------------------------- canonical JSON


@given(json_values)
def test_canonical_round_trip(value: Any) -> None:
    data = canonical_json(value)
    assert parse_canonical(data) == value
    assert canonical_json(parse_json(data)) == data
    assert data == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


@given(objects)
def test_any_other_spelling_is_refused(value: dict[str, Any]) -> None:
    data = canonical_json(value)
    spaced = json.dumps(value, sort_keys=True, ensure_ascii=False).encode()
    ascii_escaped = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    unsorted = json.dumps(
        dict(reversed(list(value.items()))), separators=(",", ":"), ensure_ascii=False
    ).encode()
    for other in {spaced, ascii_escaped, unsorted} - {data}:
        with pytest.raises(CanonicalError):
            parse_canonical(other)


@given(st.floats(allow_nan=True, allow_infinity=True), st.lists(ints, max_size=3))
def test_floats_are_refused_wherever_they_are(number: float, around: list[int]) -> None:
    with pytest.raises(CanonicalError):
        canonical_json({"a": [*around, number]})
    with pytest.raises(CanonicalError):
        canonical_json(number)


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":1.0}',
        b'{"a":1e2}',
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'{"a":-Infinity}',
        b'{"a":1,"a":2}',
        b'{"a":{"b":1,"b":1}}',
        b'{"a":9007199254740992}',
        b'{"a":-9007199254740992}',
        b'{"a":"\\ud800"}',
        b'{"a":"\xff"}',
    ],
)
def test_refused_json(text: bytes) -> None:
    with pytest.raises(CanonicalError):
        parse_canonical(text)


@pytest.mark.parametrize(
    "text",
    [b'{"a":-0}', b'{"a": 1}', b'{"b":1,"a":2}', b'{"a":"\\u00e9"}', b'{"a":"\\/"}', b"[1 ]"],
)
def test_non_canonical_spellings_are_refused(text: bytes) -> None:
    parse_json(text)  # valid JSON ...
    with pytest.raises(CanonicalError, match="not in canonical form"):
        parse_canonical(text)  # ... but not the one canonical spelling


@given(st.integers(min_value=MAX_SAFE_INTEGER + 1) | st.integers(max_value=-MAX_SAFE_INTEGER - 1))
def test_integers_outside_the_exact_range_are_refused(number: int) -> None:
    with pytest.raises(CanonicalError):
        canonical_json([number])
    with pytest.raises(CanonicalError):
        parse_json(str(number).encode())
    with pytest.raises(CanonicalError):
        parse_json(f'{{"n": {number}, "s": "x"}}'.encode())


@pytest.mark.parametrize("number", [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 10**15, 1234567890123456])
def test_long_integers_inside_the_exact_range_are_kept(number: int) -> None:
    data = canonical_json({"n": number, "s": "1234567890123456789"})
    assert parse_canonical(data) == {"n": number, "s": "1234567890123456789"}


# ---------------------------------------------------------------------------- rationals


@given(st.fractions(max_denominator=10**6))
def test_rational_strings_round_trip_exactly(value: Fraction) -> None:
    text = rational_to_str(value)
    assert str_to_rational(text) == value
    assert rational_to_str(str_to_rational(text)) == text
    import re

    assert re.fullmatch(RATIONAL_PATTERN, text)


@given(st.integers(-(10**9), 10**9), st.integers(0, 12))
def test_terminating_fractions_are_decimals(numerator: int, places: int) -> None:
    value = Fraction(numerator, 10**places)
    text = rational_to_str(value)
    assert "/" not in text
    assert Fraction(text) == value


@pytest.mark.parametrize(
    "text", ["0.50", "2/4", "+1", "1.", ".5", "01", "-0", "1/1", "0.5/1", "1e3", "1/-3", " 1"]
)
def test_non_canonical_rationals_are_refused(text: str) -> None:
    with pytest.raises(CanonicalError):
        str_to_rational(text)


# ---------------------------------------------------------------------------- records


sneaky = st.sampled_from(['","sig":"', ',"sig":"x"', '"time":"', "\\", '"', "\u2028", "\x00"])
payloads = st.dictionaries(
    st.sampled_from(["sig", "time", "note", "a", "zz", "payload"]),
    json_values | sneaky,
    max_size=5,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(payloads, st.integers(0, 10**6))
def test_record_bytes_splice_equals_full_encoding(payload: dict[str, Any], seq: int) -> None:
    """The fast record/signed-bytes splicing equals encoding the whole object again."""
    record = sign_event(
        KEY,
        run_id=RUN_ID,
        seq=seq,
        event_type="RunClosed",
        role="server",
        prev_hash=ZERO_HASH,
        payload=payload,
    )
    full = dict(record.envelope)
    full["sig"] = base64.b64encode(record.signature).decode()
    assert record.raw == canonical_json(full)
    assert signed_bytes(record.raw) == record.signed == canonical_json(record.envelope)
    assert record_bytes(record.signed, record.signature) == record.raw
    parsed = parse_record(record.raw)
    assert parsed.signed == record.signed
    assert parsed.verify_signature(KEY.public)


@given(st.binary(min_size=1, max_size=300))
def test_arbitrary_bytes_never_parse_as_a_different_record(data: bytes) -> None:
    try:
        record = parse_record(data)
    except VerificationError:
        return
    assert record.raw == data  # only canonical records parse at all


# ---------------------------------------------------------------------------- the chain


def _signed_run(count: int) -> list[bytes]:
    from .recorded_run import sha, task_terms

    opened = {
        "task_id": "t",
        "task_digest": sha("t"),
        "terms": task_terms("t").model_dump(mode="json"),
        "optimizer": "o",
        "keys": {
            role: {
                "name": KEY.name,
                "key_id": KEY.key_id_hex,
                "public_key": base64.b64encode(KEY.public.raw).decode(),
            }
            for role in ("server", "gateway", "sandbox")
        },
        "origin": f"holedger/run/{RUN_ID}",
        "checkpoint_interval": 1000,
    }
    out: list[bytes] = []
    prev = ZERO_HASH
    for seq in range(count):
        etype, payload = (
            ("RunOpened", opened) if seq == 0 else ("CandidateNominated", {"candidate": f"c{seq}"})
        )
        rec = sign_event(
            KEY,
            run_id=RUN_ID,
            seq=seq,
            event_type=etype,
            role="server",
            prev_hash=prev,
            payload=payload,
        )
        out.append(rec.raw)
        prev = hashlib.sha256(rec.signed).hexdigest()
    return out


CHAIN = _signed_run(40)
INTEGRITY = {"records", "run", "keys", "signatures", "sequence", "chain", "schema"}


class _NoBlobs:
    def blob(self, digest: str) -> bytes | None:
        return None

    def redacted(self, digest: str) -> bool:
        return False


def _integrity_failures(records: list[bytes]) -> set[str]:
    report = verify_records(RUN_ID, records, _NoBlobs(), checks=())
    return set(report.failed_checks()) & INTEGRITY


def test_an_untouched_chain_verifies() -> None:
    assert _integrity_failures(CHAIN) == set()


@given(st.integers(1, len(CHAIN) - 2))
def test_deleting_any_event_breaks_the_chain(index: int) -> None:
    assert {"sequence", "chain"} <= _integrity_failures(CHAIN[:index] + CHAIN[index + 1 :])


@given(st.integers(1, len(CHAIN) - 1), st.integers(1, len(CHAIN) - 1))
def test_reordering_any_two_events_breaks_the_chain(a: int, b: int) -> None:
    if a == b:
        return
    swapped = list(CHAIN)
    swapped[a], swapped[b] = swapped[b], swapped[a]
    assert "sequence" in _integrity_failures(swapped)


@given(st.integers(1, len(CHAIN) - 1))
def test_duplicating_any_event_breaks_the_chain(index: int) -> None:
    assert "sequence" in _integrity_failures(CHAIN[: index + 1] + CHAIN[index:])


# ---------------------------------------------------------------------------- Merkle


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 section 2.1 MTH, written out independently of holedger.ledger.merkle."""
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def test_frontier_root_equals_recursive_mth_for_every_size_to_300() -> None:
    leaves = [f"leaf {i}".encode() for i in range(300)]
    frontier = MerkleFrontier()
    hashes: list[bytes] = []
    for size in range(1, 301):
        frontier.append(leaf_hash(leaves[size - 1]))
        hashes.append(leaf_hash(leaves[size - 1]))
        expected = _mth(leaves[:size])
        assert frontier.root() == expected, size
        assert root_from_leaf_hashes(hashes) == expected, size


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=300))
def test_frontier_root_equals_recursive_mth_for_random_leaves(leaves: list[bytes]) -> None:
    frontier = MerkleFrontier()
    for leaf in leaves:
        frontier.append(leaf_hash(leaf))
    assert frontier.size == len(leaves)
    assert frontier.root() == _mth(leaves)
    copy = frontier.copy()
    copy.append(leaf_hash(b"more"))
    assert frontier.root() == _mth(leaves)  # a copy never shares state


@pytest.mark.parametrize("change", ["type", "schema_version"])
def test_unknown_event_types_and_schema_versions_fail(change: str) -> None:
    """Even correctly signed and chained: an unknown type or version is refused."""
    from holedger.ledger.records import sign_envelope

    last = parse_record(CHAIN[-1])
    envelope = {
        "run_id": RUN_ID,
        "seq": last.seq + 1,
        "type": "Mystery" if change == "type" else "CandidateNominated",
        "schema_version": 2 if change == "schema_version" else 1,
        "time": last.envelope["time"],
        "role": "server",
        "key_id": KEY.key_id_hex,
        "prev_hash": last.event_hash,
        "payload": {"candidate": "c"},
    }
    record = sign_envelope(KEY, envelope, canonical_json(envelope))
    report = verify_records(RUN_ID, [*CHAIN, record.raw], _NoBlobs(), checks=())
    assert "schema" in report.failed_checks()
    failure = next(f for f in report.failures if f.check == "schema")
    assert failure.seq == last.seq + 1
    assert ("Mystery" if change == "type" else "schema version") in failure.reason
