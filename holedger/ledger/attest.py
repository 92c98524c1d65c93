"""Signed result attestations: in-toto Statement v1 in a DSSE v1 envelope, Ed25519.

* DSSE (github.com/secure-systems-lab/dsse, protocol v1): the signature is over
  ``PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body`` (lengths in
  ASCII decimal bytes). Envelope: ``{"payload": b64, "payloadType": str,
  "signatures": [{"keyid": str, "sig": b64}]}``. Verifiers accept standard and URL-safe
  base64, and use only the verified payload bytes afterwards.
* in-toto Statement v1 (``_type`` ``https://in-toto.io/Statement/v1``), payload type
  ``application/vnd.in-toto+json``, with the holedger predicate
  :data:`RUN_RESULT_PREDICATE` (documented in docs/FORMAT.md).
* ``keyid`` is the signer's C2SP key id, 8 lower-case hex digits.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from holedger.errors import CanonicalError, VerificationError
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.schemas.canonical import canonical_json, parse_json

DSSE_PREFIX = b"DSSEv1"
IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
RUN_RESULT_PREDICATE = "https://holedger.dev/attestation/run-result/v1"
MAX_ENVELOPE_BYTES = 16 << 20


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 Pre-Authentication Encoding."""
    t = payload_type.encode("utf-8")
    return b" ".join([DSSE_PREFIX, str(len(t)).encode(), t, str(len(payload)).encode(), payload])


def sign_envelope(payload: bytes, payload_type: str, keys: Sequence[SigningKey]) -> dict[str, Any]:
    """A DSSE envelope over ``payload`` signed by every key in ``keys``."""
    message = pae(payload_type, payload)
    return {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": payload_type,
        "signatures": [
            {"keyid": k.key_id_hex, "sig": base64.b64encode(k.sign(message)).decode()} for k in keys
        ],
    }


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise VerificationError(f"DSSE {what} is not a string")
    text = value.strip()
    try:
        if "-" in text or "_" in text:
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise VerificationError(f"DSSE {what} is not base64") from exc


@dataclass(frozen=True)
class VerifiedEnvelope:
    payload_type: str
    payload: bytes
    key_ids: tuple[str, ...]


def verify_envelope(
    envelope: Mapping[str, Any] | bytes | str,
    trusted: Sequence[PublicKey],
    *,
    threshold: int = 1,
) -> VerifiedEnvelope:
    """Check a DSSE envelope: at least ``threshold`` distinct trusted keys signed it."""
    if threshold < 1:
        raise VerificationError("a DSSE threshold is at least 1")
    if isinstance(envelope, bytes | str):
        data = envelope.encode() if isinstance(envelope, str) else envelope
        if len(data) > MAX_ENVELOPE_BYTES:
            raise VerificationError("DSSE envelope is too large")
        try:
            parsed = parse_json(data)
        except CanonicalError as exc:
            raise VerificationError(f"DSSE envelope is not JSON: {exc.message}") from exc
        if not isinstance(parsed, dict):
            raise VerificationError("DSSE envelope is not a JSON object")
        envelope = parsed
    payload_type = envelope.get("payloadType")
    if not isinstance(payload_type, str):
        raise VerificationError("DSSE envelope has no payloadType")
    payload = _b64(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise VerificationError("DSSE envelope has no signatures")
    message = pae(payload_type, payload)
    good: list[str] = []
    for entry in signatures:
        if not isinstance(entry, dict):
            raise VerificationError("DSSE signature entry is not an object")
        sig = _b64(entry.get("sig"), "signature")
        keyid = entry.get("keyid", "")
        candidates = [k for k in trusted if not keyid or k.key_id_hex == keyid]
        for key in candidates:
            if key.key_id_hex not in good and key.verify(sig, message):
                good.append(key.key_id_hex)
                break
    if len(good) < threshold:
        raise VerificationError(
            f"DSSE envelope has {len(good)} valid signature(s) by trusted keys, {threshold} needed"
        )
    return VerifiedEnvelope(payload_type, payload, tuple(good))


def statement(
    subjects: Sequence[tuple[str, str]], predicate_type: str, predicate: Mapping[str, Any]
) -> dict[str, Any]:
    """An in-toto Statement v1; ``subjects`` are (name, sha256 hex) pairs."""
    if not subjects:
        raise ValueError("an in-toto statement has at least one subject")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": d}} for n, d in subjects],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def attest(
    subjects: Sequence[tuple[str, str]],
    predicate: Mapping[str, Any],
    key: SigningKey,
    predicate_type: str = RUN_RESULT_PREDICATE,
) -> dict[str, Any]:
    """Sign a statement: the payload is its canonical JSON bytes."""
    payload = canonical_json(statement(subjects, predicate_type, predicate))
    return sign_envelope(payload, IN_TOTO_PAYLOAD_TYPE, [key])


def verify_attestation(
    envelope: Mapping[str, Any] | bytes | str,
    trusted: Sequence[PublicKey],
    *,
    predicate_type: str | None = RUN_RESULT_PREDICATE,
) -> dict[str, Any]:
    """Verify the envelope, then parse *its verified payload* as an in-toto Statement v1."""
    verified = verify_envelope(envelope, trusted)
    if verified.payload_type != IN_TOTO_PAYLOAD_TYPE:
        raise VerificationError(f"payload type {verified.payload_type!r} is not in-toto")
    try:
        stmt = json.loads(verified.payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise VerificationError("attestation payload is not JSON") from exc
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise VerificationError("attestation payload is not an in-toto Statement v1")
    subjects = stmt.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise VerificationError("attestation statement has no subjects")
    for s in subjects:
        if not isinstance(s, dict) or not isinstance(s.get("digest"), dict) or not s["digest"]:
            raise VerificationError("every attestation subject needs a digest")
    if predicate_type is not None and stmt.get("predicateType") != predicate_type:
        raise VerificationError(f"predicate type {stmt.get('predicateType')!r} is not expected")
    return stmt
