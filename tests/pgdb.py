"""The PostgreSQL server the tests use, and fresh databases on it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_ADMIN_URL = os.environ.get(
    "HOLEDGER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def pg_conninfo(url: str) -> str:
    """A SQLAlchemy psycopg URL as a plain libpq connection string."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def fresh_database(prefix: str) -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it afterwards. Skips when unreachable."""
    try:
        import psycopg

        admin = psycopg.connect(pg_conninfo(PG_ADMIN_URL), autocommit=True, connect_timeout=3)
    except Exception as exc:  # the server is down or refuses us: skip, saying why
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} is unreachable: {exc}")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(pg_conninfo(PG_ADMIN_URL), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
