"""Fixtures for the ledger tests: keys, a SQLite ledger, and a fresh PostgreSQL database.

PostgreSQL tests (``@pytest.mark.postgres``) run against 127.0.0.1:5432 (user postgres,
database test) in a database created for this session and dropped after it, so tables
start empty and other test sessions are never disturbed. They skip, with the reason,
when the server is unreachable.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger

PG_ADMIN_URL = os.environ.get(
    "HOLEDGER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _pg_conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session (dropped afterwards)."""
    try:
        import psycopg

        admin = psycopg.connect(_pg_conninfo(PG_ADMIN_URL), autocommit=True, connect_timeout=3)
    except Exception as exc:  # the server is down or refuses us: skip, saying why
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} is unreachable: {exc}")
    name = f"holedger_ledger_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(_pg_conninfo(PG_ADMIN_URL), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def operator_key() -> SigningKey:
    return SigningKey.generate("holedger-operator")


@pytest.fixture()
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture()
def sqlite_ledger(sqlite_url: str, operator_key: SigningKey) -> Iterator[Ledger]:
    ledger = Ledger.open(sqlite_url, operator_key, checkpoint_interval=32)
    yield ledger
    ledger.close()
