"""Sound Ed25519 public keys only: small-order points, non-canonical and off-curve
encodings are refused where keys are declared (RunOpened) or pinned (verifier keys).

A small-order public key makes verification hold for signatures nobody made, so whoever
declares one can disown what was "signed" with it. The arithmetic is checked against
``cryptography``: the public key derived here from a seed (RFC 8032 5.1.5) must equal the
library's.
"""

from __future__ import annotations

import base64
import hashlib
import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from holedger.errors import UsageError
from holedger.ledger.edwards import (
    IDENTITY,
    P,
    decode_point,
    encode_point,
    multiply,
    public_key_problem,
)
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import ALG_ED25519, PublicKey, SigningKey, key_id_bytes
from holedger.ledger.note import parse_vkey
from holedger.ledger.store import Ledger
from holedger.replay.runs import LedgerBlobs, verify_records
from ledger.attacker import Row, resign_run
from ledger.recorded_run import record_run

# RFC 8032: the base point and the order of the prime-order subgroup.
BASE = bytes.fromhex("5866666666666666666666666666666666666666666666666666666666666666")
ORDER = 2**252 + 27742317777372353535851937790883648493


def _public(seed: bytes) -> bytes:
    key = Ed25519PrivateKey.from_private_bytes(seed).public_key()
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def test_the_arithmetic_derives_the_public_keys_cryptography_derives() -> None:
    base = decode_point(BASE)
    assert base is not None and multiply(base, ORDER) == IDENTITY
    rng = random.Random(7)
    for _ in range(5):
        seed = rng.randbytes(32)
        digest = hashlib.sha512(seed).digest()
        scalar = int.from_bytes(digest[:32], "little") & ((1 << 254) - 8) | (1 << 254)
        assert encode_point(multiply(base, scalar)) == _public(seed)
        assert public_key_problem(_public(seed)) is None


def _torsion_points() -> set[bytes]:
    """The eight points of small order: [ORDER] times random curve points lands on them."""
    rng = random.Random(11)
    found: set[bytes] = set()
    while len(found) < 8:
        point = decode_point(rng.randbytes(32))
        if point is not None:
            found.add(encode_point(multiply(point, ORDER)))
    return found


def test_every_small_order_point_is_refused() -> None:
    points = _torsion_points()
    assert bytes(32) in points and (1).to_bytes(32, "little") in points
    for raw in points:
        assert "small order" in (public_key_problem(raw) or ""), raw.hex()


def test_non_canonical_and_off_curve_encodings_are_refused() -> None:
    for y in (P, P + 1, 2**255 - 1):  # y >= p: non-canonical encodings
        assert public_key_problem(y.to_bytes(32, "little")) is not None
    off_curve = next(
        y.to_bytes(32, "little")
        for y in range(2, 100)
        if decode_point(y.to_bytes(32, "little")) is None
    )
    assert "canonical encoding of a curve point" in (public_key_problem(off_curve) or "")
    assert public_key_problem(bytes(31)) == "not 32 bytes"
    # x = 0 with the sign bit set is no encoding (RFC 8032 5.1.3, step 4)
    assert public_key_problem((1 | 1 << 255).to_bytes(32, "little")) is not None


def _vkey(name: str, raw: bytes) -> str:
    blob = base64.b64encode(bytes([ALG_ED25519]) + raw).decode()
    return f"{name}+{key_id_bytes(name, raw).hex()}+{blob}"


def test_a_small_order_key_cannot_be_pinned() -> None:
    with pytest.raises(UsageError, match="small order"):
        PublicKey.from_vkey(_vkey("holedger-operator", bytes(32)))
    with pytest.raises(UsageError, match="small order"):
        parse_vkey(_vkey("witness", bytes(32)))
    genuine = SigningKey.generate("holedger-operator").public
    assert PublicKey.from_vkey(genuine.vkey()) == genuine


def test_replay_refuses_a_run_that_declares_a_small_order_key(tmp_path: Path) -> None:
    key = SigningKey.generate("holedger-operator")
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", key)
    run_id = record_run(ledger, rounds=1)
    rows = [
        Row(i, i + 1, parse_record(raw).type, raw)
        for i, (_, raw) in enumerate(ledger.raw_records(run_id))
    ]
    weak = bytes(32)
    declared = {
        "name": "holedger-gateway",
        "key_id": key_id_bytes("holedger-gateway", weak).hex(),
        "public_key": base64.b64encode(weak).decode(),
    }
    records = resign_run(rows, key, declare={"gateway": declared})
    report = verify_records(run_id, records, LedgerBlobs(ledger), checks=())
    assert not report.verified
    first = report.failures[0]
    assert (first.seq, first.check) == (0, "keys")
    assert "gateway key is unusable" in first.reason and "small order" in first.reason
