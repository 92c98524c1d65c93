"""DSSE v1 envelopes and in-toto Statement v1 attestations."""

from __future__ import annotations

import base64
import json

import pytest

from holedger.errors import VerificationError
from holedger.ledger.attest import (
    IN_TOTO_PAYLOAD_TYPE,
    RUN_RESULT_PREDICATE,
    attest,
    pae,
    sign_envelope,
    verify_attestation,
    verify_envelope,
)
from holedger.ledger.keys import SigningKey

KEY = SigningKey.from_seed("example.com/operator", b"\x05" * 32)
OTHER = SigningKey.from_seed("example.com/other", b"\x06" * 32)


def test_pae_matches_the_dsse_spec_example() -> None:
    # secure-systems-lab/dsse protocol.md test vector.
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_pae_counts_bytes_not_characters() -> None:
    assert pae("t\u00e9", b"") == "DSSEv1 3 t\u00e9 0 ".encode()


def test_envelope_round_trip_and_keyid_is_the_c2sp_key_id() -> None:
    env = sign_envelope(b"hello world", "http://example.com/HelloWorld", [KEY])
    assert env["signatures"][0]["keyid"] == KEY.key_id_hex
    v = verify_envelope(json.dumps(env), [KEY.public])
    assert v.payload == b"hello world" and v.key_ids == (KEY.key_id_hex,)


def test_url_safe_base64_is_accepted() -> None:
    env = sign_envelope(bytes(range(256)), "x", [KEY])
    env["payload"] = base64.urlsafe_b64encode(bytes(range(256))).decode().rstrip("=")
    assert verify_envelope(env, [KEY.public]).payload == bytes(range(256))


@pytest.mark.parametrize("field", ["payload", "payloadType", "sig"])
def test_any_change_breaks_the_envelope(field: str) -> None:
    env = sign_envelope(b"hello world", "t", [KEY])
    if field == "payload":
        env["payload"] = base64.b64encode(b"hello World").decode()
    elif field == "payloadType":
        env["payloadType"] = "u"
    else:
        sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
        sig[0] ^= 1
        env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    with pytest.raises(VerificationError):
        verify_envelope(env, [KEY.public])


def test_untrusted_key_and_threshold() -> None:
    env = sign_envelope(b"x", "t", [KEY, OTHER])
    with pytest.raises(VerificationError, match="0 valid"):
        verify_envelope(env, [SigningKey.generate("n").public])
    assert len(verify_envelope(env, [KEY.public, OTHER.public], threshold=2).key_ids) == 2
    dup = sign_envelope(b"x", "t", [KEY, KEY])
    with pytest.raises(VerificationError, match="2 needed"):
        verify_envelope(dup, [KEY.public], threshold=2)


def test_attestation_round_trip() -> None:
    env = attest([("holedger/run/r1", "ab" * 32)], {"verdict": "verified"}, KEY)
    assert env["payloadType"] == IN_TOTO_PAYLOAD_TYPE
    stmt = verify_attestation(env, [KEY.public])
    assert stmt["predicateType"] == RUN_RESULT_PREDICATE
    assert stmt["subject"][0]["digest"]["sha256"] == "ab" * 32
    with pytest.raises(VerificationError, match="predicate type"):
        verify_attestation(env, [KEY.public], predicate_type="https://example.com/other")


@pytest.mark.parametrize("bad", [b"not json", b"[]", b'{"payload": 1}', b"{}"])
def test_malformed_envelopes_are_refused(bad: bytes) -> None:
    with pytest.raises(VerificationError):
        verify_envelope(bad, [KEY.public])


def test_a_signed_non_statement_is_not_an_attestation() -> None:
    env = sign_envelope(b'{"_type": "other"}', IN_TOTO_PAYLOAD_TYPE, [KEY])
    with pytest.raises(VerificationError, match="Statement"):
        verify_attestation(env, [KEY.public])
