"""docs/FORMAT.md, followed by an independent verifier: only json, hashlib, base64 and
``cryptography``. Nothing below the recording fixture imports holedger."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .recorded_run import record_run

# ---------------------------------------------------------------------------- the verifier


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def no_floats(text: bytes) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"float {token}")

    return json.loads(text, parse_float=refuse, parse_constant=refuse)


def split_record(raw: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """(envelope, signed bytes, signature) of one stored record."""
    record = no_floats(raw)
    signature = base64.b64decode(record.pop("sig"), validate=True)
    signed = canonical(record)
    assert canonical({**record, "sig": base64.b64encode(signature).decode()}) == raw
    return record, signed, signature


def c2sp_key_id(name: str, public_key: bytes) -> str:
    return hashlib.sha256(name.encode() + b"\n\x01" + public_key).digest()[:4].hex()


def declared_key(opened: dict[str, Any], role: str) -> tuple[str, bytes, str]:
    info = opened["payload"]["keys"][role]
    public_key = base64.b64decode(info["public_key"])
    assert len(public_key) == 32
    assert c2sp_key_id(info["name"], public_key) == info["key_id"]
    return info["name"], public_key, info["key_id"]


def verify_event(raw: bytes, opened_raw: bytes) -> dict[str, Any]:
    """Verify one event's signature under the key its run's RunOpened declares."""
    envelope, signed, signature = split_record(raw)
    opened, _, _ = split_record(opened_raw)
    assert opened["seq"] == 0 and opened["type"] == "RunOpened"
    assert opened["run_id"] == envelope["run_id"]
    _, public_key, key_id = declared_key(opened, envelope["role"])
    assert envelope["key_id"] == key_id
    Ed25519PublicKey.from_public_bytes(public_key).verify(signature, signed)  # raises
    return envelope


def mth(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while 2 * k < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + mth(leaves[:k]) + mth(leaves[k:])).digest()


def verify_note(note: str, name: str, public_key: bytes) -> str:
    """The text of a C2SP signed note that ``name``'s Ed25519 key signed."""
    text, _, signatures = note.rpartition("\n\n")
    text += "\n"
    for line in signatures.splitlines():
        dash, signer, blob = line.split(" ")
        raw = base64.b64decode(blob)
        if dash == "\u2014" and signer == name and raw[:4].hex() == c2sp_key_id(name, public_key):
            Ed25519PublicKey.from_public_bytes(public_key).verify(raw[4:], text.encode())
            return text
    raise AssertionError("no signature by the server key")


# ---------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    from holedger.ledger.keys import SigningKey
    from holedger.ledger.store import Ledger

    url = f"sqlite:///{tmp_path_factory.mktemp('format') / 'ledger.db'}"
    ledger = Ledger.open(url, SigningKey.generate("holedger-operator"), checkpoint_interval=32)
    run_id = record_run(ledger, rounds=3)
    raws = [raw for _, raw in ledger.raw_records(run_id)]
    ledger.close()
    return raws


def test_one_event_verifies_with_only_a_json_parser_and_ed25519(stored: list[bytes]) -> None:
    envelope = verify_event(stored[5], stored[0])
    assert envelope["seq"] == 5


def test_the_whole_run_verifies_independently(stored: list[bytes]) -> None:
    prev = "0" * 64
    leaves: list[bytes] = []
    opened, _, _ = split_record(stored[0])
    name, server_key, _ = declared_key(opened, "server")
    checkpoints = 0
    for seq, raw in enumerate(stored):
        envelope = verify_event(raw, stored[0])
        _, signed, _ = split_record(raw)
        assert envelope["seq"] == seq
        assert envelope["prev_hash"] == prev
        if envelope["type"] == "Checkpoint":
            payload = envelope["payload"]
            root = mth(leaves)
            assert payload["size"] == seq == len(leaves)
            assert payload["root"] == root.hex()
            text = verify_note(payload["note"], name, server_key)
            origin = f"holedger/run/{envelope['run_id']}"
            assert text == f"{origin}\n{seq}\n{base64.b64encode(root).decode()}\n"
            checkpoints += 1
        prev = hashlib.sha256(signed).hexdigest()
        leaves.append(hashlib.sha256(b"\x00" + signed).digest())
    assert checkpoints >= 3
    assert [split_record(r)[0]["type"] for r in stored[-2:]] == ["RunClosed", "Checkpoint"]


def test_a_changed_byte_fails_the_independent_verifier(stored: list[bytes]) -> None:
    raw = stored[7].replace(b'"status":200', b'"status":201')
    assert raw != stored[7]
    with pytest.raises(InvalidSignature):
        verify_event(raw, stored[0])
