"""A non-ASCII character where base64 is expected is refused as bad input, never a crash.

Python's base64 decoder raises a plain ValueError, not binascii.Error, for a non-ASCII
character in a str; every reader of base64 in holedger goes through
``canonical.b64decode_strict``, which returns None for both.
"""

from __future__ import annotations

import pytest

from holedger.errors import UsageError, VerificationError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.ledger.note import checkpoint_body, parse_checkpoint
from holedger.ledger.records import sign_event
from holedger.replay.runs import verify_records
from holedger.schemas.canonical import b64decode_strict

KEY = SigningKey.from_seed("non-ascii-test", bytes(range(32)))
RUN = "5cc5c15a-c7bd-4381-be43-6f071cd22836"


def test_the_helper() -> None:
    assert b64decode_strict("AAEC") == b"\x00\x01\x02"
    assert b64decode_strict("AAE\u00e9") is None
    assert b64decode_strict("AAE") is None  # padding
    assert b64decode_strict("AA EC") is None  # outside the alphabet


def test_a_signature_with_a_non_ascii_character_is_a_malformed_record() -> None:
    rec = sign_event(
        KEY,
        run_id=RUN,
        seq=0,
        event_type="RunClosed",
        payload={"reason": "completed", "summary": {}},
        role="server",
        prev_hash="00" * 32,
    )
    at = rec.raw.index(b'"sig":"') + 7
    raw = rec.raw[:at] + "\u00e9".encode() + rec.raw[at + 2 :]
    with pytest.raises(VerificationError, match="signature is not base64"):
        parse_record(raw)
    report = verify_records(RUN, [raw], None, checks=())
    assert not report.verified
    assert "signature is not base64" in report.failures[0].reason


def test_a_verifier_key_with_a_non_ascii_character() -> None:
    vkey = KEY.public.vkey()
    with pytest.raises(UsageError, match="bad base64"):
        PublicKey.from_vkey(vkey[:-2] + "\u00e9=")


def test_a_checkpoint_root_with_a_non_ascii_character() -> None:
    text = checkpoint_body(f"holedger/run/{RUN}", 3, bytes(32))
    lines = text.split("\n")
    lines[2] = lines[2][:-2] + "\u00e9="
    with pytest.raises(VerificationError, match="root is not base64"):
        parse_checkpoint("\n".join(lines))
