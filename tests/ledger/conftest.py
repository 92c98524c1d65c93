"""Fixtures for the ledger tests: keys, a SQLite ledger, and a fresh PostgreSQL database.

PostgreSQL tests (``@pytest.mark.postgres``) run against 127.0.0.1:5432 (user postgres,
database test) in a database created for this session and dropped after it, so tables
start empty and other test sessions are never disturbed. They skip, with the reason,
when the server is unreachable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pgdb import fresh_database

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session (dropped afterwards)."""
    yield from fresh_database("holedger_ledger")


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
