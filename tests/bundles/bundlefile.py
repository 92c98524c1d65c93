"""A second, independent reading of the bundle layout (docs/FORMAT.md), for attacks.

The tests use it the way an attacker would: take a bundle apart, change entries, and put
it back together with a consistent end entry, so that only holedger's real checks
(signatures, chain, checkpoints, digests, git ids) stand between the edit and a verdict.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note
from holedger.ledger.records import sign_event
from holedger.schemas.types import ZERO_HASH

MAGIC = b"HLBUNDLE"
END = 0xFF
NAMES = {
    0x01: "manifest",
    0x02: "key",
    0x03: "record",
    0x04: "blob",
    0x05: "redacted",
    0x06: "git_object",
    0x07: "git_ref",
    0x08: "checkpoint",
    0xFF: "end",
}

Entry = tuple[int, bytes]


def read_entries(data: bytes) -> tuple[int, list[Entry]]:
    assert data[:8] == MAGIC
    (version,) = struct.unpack(">H", data[8:10])
    pos, entries = 10, []
    while pos < len(data):
        kind, length = struct.unpack(">BI", data[pos : pos + 5])
        entries.append((kind, data[pos + 5 : pos + 5 + length]))
        pos += 5 + length
    return version, entries


def write_entries(version: int, entries: list[Entry]) -> bytes:
    """Serialise entries, replacing the end entry by one with matching counts."""
    body = [e for e in entries if e[0] != END]
    counts = {name: 0 for k, name in NAMES.items() if k not in (0x01, END)}
    for kind, _ in body:
        if kind in NAMES and kind != 0x01:
            counts[NAMES[kind]] += 1
    end = json.dumps({"counts": counts}, sort_keys=True, separators=(",", ":")).encode()
    out = [MAGIC, struct.pack(">H", version)]
    for kind, data in [*body, (END, end)]:
        out.append(struct.pack(">BI", kind, len(data)))
        out.append(data)
    return b"".join(out)


def rewrite(src: Path, dst: Path, entries: list[Entry], version: int | None = None) -> Path:
    v, _ = read_entries(src.read_bytes())
    dst.write_bytes(write_entries(version if version is not None else v, entries))
    return dst


def entries_of(path: Path) -> list[Entry]:
    return read_entries(path.read_bytes())[1]


def records(entries: list[Entry]) -> list[bytes]:
    return [data for kind, data in entries if kind == 0x03]


def replace_records(entries: list[Entry], new: list[bytes]) -> list[Entry]:
    out: list[Entry] = []
    inserted = False
    for kind, data in entries:
        if kind == 0x03:
            if not inserted:
                out.extend((0x03, r) for r in new)
                inserted = True
            continue
        out.append((kind, data))
    return out


def resign_run(recs: list[bytes], key: SigningKey) -> list[bytes]:
    """Rewrite the whole run under ``key``: re-declare it, re-chain, re-checkpoint."""
    out: list[bytes] = []
    prev, frontier = ZERO_HASH, MerkleFrontier()
    for raw in recs:
        rec = parse_record(raw)
        payload = dict(rec.payload)
        if rec.type == "RunOpened":
            info = {"name": key.name, "key_id": key.key_id_hex, "public_key": key.public.b64}
            payload["keys"] = {role: info for role in payload["keys"]}
        if rec.type == "Checkpoint":
            root = frontier.root()
            origin = f"holedger/run/{rec.run_id}"
            note = sign_note(checkpoint_body(origin, frontier.size, root), key)
            payload = {"size": frontier.size, "root": root.hex(), "note": note}
        new = sign_event(
            key,
            run_id=rec.run_id,
            seq=rec.seq,
            event_type=rec.type,
            role=rec.role,  # type: ignore[arg-type]
            prev_hash=prev,
            payload=payload,
            time=str(rec.envelope["time"]),
        )
        out.append(new.raw)
        prev = new.event_hash
        frontier.append(new.leaf_hash)
    return out
