"""Direct database edits, as an attacker with write access to the ledger database would.

Everything here goes around holedger: plain SQL on ``holedger_events`` and
``holedger_blobs`` through its own connection, never through the Ledger API.
"""

from __future__ import annotations

import base64
import hashlib
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.note import checkpoint_body, sign_note
from holedger.ledger.records import sign_event
from holedger.schemas.types import ZERO_HASH


@dataclass(frozen=True)
class Row:
    id: int
    version: int
    topic: str
    state: bytes


class Attacker:
    def __init__(self, url: str) -> None:
        self.engine: Engine = create_engine(url)
        self.sqlite = self.engine.dialect.name == "sqlite"

    def close(self) -> None:
        self.engine.dispose()

    def _rid(self, run_id: str) -> Any:
        return uuid.UUID(run_id).bytes if self.sqlite else uuid.UUID(run_id)

    def rows(self, run_id: str) -> list[Row]:
        with self.engine.connect() as conn:
            result = conn.execute(
                text(
                    "SELECT id, originator_version, topic, state FROM holedger_events "
                    "WHERE originator_id = :rid ORDER BY originator_version"
                ),
                {"rid": self._rid(run_id)},
            )
            return [Row(int(i), int(v), str(t), bytes(s)) for i, v, t, s in result]

    def set_state(self, run_id: str, version: int, state: bytes) -> None:
        self._exec(
            "UPDATE holedger_events SET state = :s WHERE originator_id = :rid "
            "AND originator_version = :v",
            s=state,
            rid=self._rid(run_id),
            v=version,
        )

    def delete(self, run_id: str, version: int) -> None:
        self._exec(
            "DELETE FROM holedger_events WHERE originator_id = :rid AND originator_version = :v",
            rid=self._rid(run_id),
            v=version,
        )

    def delete_from(self, run_id: str, version: int) -> None:
        self._exec(
            "DELETE FROM holedger_events WHERE originator_id = :rid AND originator_version >= :v",
            rid=self._rid(run_id),
            v=version,
        )

    def move(self, from_run: str, version: int, to_run: str) -> None:
        """Take run ``from_run``'s event at ``version`` into ``to_run`` at the same place."""
        self.delete(to_run, version)
        self._exec(
            "UPDATE holedger_events SET originator_id = :to WHERE originator_id = :src "
            "AND originator_version = :v",
            to=self._rid(to_run),
            src=self._rid(from_run),
            v=version,
        )

    def restore(self, run_id: str, rows: list[Row]) -> None:
        """Put the run's rows back exactly as they were (ids included)."""
        self.delete_from(run_id, 0)
        with self.engine.begin() as conn:
            for row in rows:
                conn.execute(
                    text(
                        "INSERT INTO holedger_events "
                        "(id, originator_id, originator_version, topic, state) "
                        "VALUES (:id, :rid, :v, :t, :s)"
                    ),
                    {
                        "id": row.id,
                        "rid": self._rid(run_id),
                        "v": row.version,
                        "t": row.topic,
                        "s": row.state,
                    },
                )

    def blob(self, digest: str) -> bytes:
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT data FROM holedger_blobs WHERE digest = :d"), {"d": digest}
            ).one()
        return bytes(row[0])

    def set_blob(self, digest: str, data: bytes) -> None:
        self._exec("UPDATE holedger_blobs SET data = :b WHERE digest = :d", b=data, d=digest)

    def _exec(self, sql: str, **params: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(sql), params)


def flip(raw: bytes, position: int) -> bytes:
    """``raw`` with one bit of the byte at ``position`` flipped."""
    out = bytearray(raw)
    out[position] ^= 0x01
    return bytes(out)


def mutate(rng: random.Random, raw: bytes, alphabet: bytes) -> bytes:
    """``raw`` with one to three random edits: a byte of ``alphabet`` put in place of
    one, a byte of ``alphabet`` inserted, or a byte deleted."""
    out = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(out))
        op = rng.random()
        if op < 0.4:
            out[at] = rng.choice(alphabet)
        elif op < 0.7:
            out.insert(at, rng.choice(alphabet))
        else:
            del out[at]
    return bytes(out)


def forge_signature(raw: bytes) -> bytes:
    """``raw`` with one character of its signature replaced by another base64 character:
    still a well-formed record, whose signature no longer verifies (flipping a bit could
    leave the base64 alphabet, e.g. "A" to "@", and make a malformed record instead)."""
    at = raw.rindex(b',"sig":"') + 12
    other = b"B" if raw[at : at + 1] != b"B" else b"C"
    return raw[:at] + other + raw[at + 1 :]


def resign_run(
    rows: list[Row],
    key: SigningKey,
    declare: dict[str, dict[str, str]] | None = None,
    edit: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
    renumber: bool = False,
) -> list[bytes]:
    """Rewrite a whole run under ``key``: RunOpened declares it, every event is re-signed,
    re-chained and every checkpoint recomputed, so only a pinned key can tell.
    ``declare`` makes RunOpened declare other key entries for some roles; ``edit`` (event
    type, payload) -> payload changes what the events say, as a key holder could;
    ``renumber`` gives the events seq 0, 1, ... in the order of ``rows`` (rows reordered)."""
    out: list[bytes] = []
    prev = ZERO_HASH
    frontier = MerkleFrontier()
    declared = {
        "name": key.name,
        "key_id": key.key_id_hex,
        "public_key": base64.b64encode(key.public.raw).decode(),
    }
    for index, row in enumerate(rows):
        rec = parse_record(row.state)
        payload = dict(rec.payload)
        if edit is not None:
            payload = edit(rec.type, payload)
        if rec.type == "RunOpened":
            payload["keys"] = {role: declared for role in payload["keys"]} | (declare or {})
        if rec.type == "Checkpoint":
            root = frontier.root()
            body = checkpoint_body(f"holedger/run/{rec.run_id}", frontier.size, root)
            payload = {"size": frontier.size, "root": root.hex(), "note": sign_note(body, key)}
        forged = sign_event(
            key,
            run_id=rec.run_id,
            seq=index if renumber else rec.seq,
            event_type=rec.type,
            role=rec.role,  # type: ignore[arg-type]
            prev_hash=prev,
            payload=payload,
            time=str(rec.envelope["time"]),
        )
        out.append(forged.raw)
        prev = hashlib.sha256(forged.signed).hexdigest()
        frontier.append(forged.leaf_hash)
    return out
