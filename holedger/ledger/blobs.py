"""Blobs: content-addressed bytes (trial outputs, answers, traces, evidence) in the
``holedger_blobs`` table of the ledger's database, keyed by their SHA-256."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, Integer, LargeBinary, MetaData, String, Table, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from holedger.errors import UsageError

MAX_BLOB_BYTES = 64 << 20

_metadata = MetaData()
blobs_table = Table(
    "holedger_blobs",
    _metadata,
    Column("digest", String(64), primary_key=True),
    Column("size", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
)


def blob_rows(blobs: Sequence[bytes]) -> tuple[list[str], list[dict[str, Any]]]:
    """The blobs' digests in order, and one blobs-table row per distinct blob."""
    for data in blobs:
        if len(data) > MAX_BLOB_BYTES:
            raise UsageError(f"blob of {len(data)} bytes is over the {MAX_BLOB_BYTES} byte cap")
    digests = [hashlib.sha256(data).hexdigest() for data in blobs]
    rows = {
        d: {"digest": d, "size": len(b), "data": b} for d, b in zip(digests, blobs, strict=True)
    }
    return digests, list(rows.values())


def insert_blobs(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert blobs-table rows in ``session``'s transaction; a blob already there is kept
    (content addressed: same digest, same bytes)."""
    dialect = session.get_bind().dialect.name
    # In digest order: two writers inserting overlapping sets take the rows' locks in the
    # same order, so neither waits for the other while holding what it needs (deadlock).
    ordered = sorted(rows, key=lambda row: str(row["digest"]))
    if dialect in ("sqlite", "postgresql"):
        # The driver's executemany, skipping SQLAlchemy's per-row bind processing of the
        # binary column (it cost more than the insert); errors still come wrapped as
        # SQLAlchemy's, which the recorder's transaction turns into eventsourcing's.
        mark = "?" if dialect == "sqlite" else "%s"
        sql = (
            f"INSERT INTO {blobs_table.name} (digest, size, data) "
            f"VALUES ({mark}, {mark}, {mark}) ON CONFLICT (digest) DO NOTHING"
        )
        session.connection().exec_driver_sql(
            sql, [(row["digest"], row["size"], row["data"]) for row in ordered]
        )
    else:
        for row in ordered:
            present = session.execute(
                select(blobs_table.c.size).where(blobs_table.c.digest == row["digest"])
            ).first()
            if present is None:
                session.execute(blobs_table.insert().values(**row))


def create_blobs_table(engine: Engine) -> None:
    """Create the blobs table where it is missing."""
    _metadata.create_all(engine, checkfirst=True)
