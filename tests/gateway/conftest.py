"""Fixtures: a temporary SQLite ledger with one open run and a live gateway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import CountingUpstream, Env, close_env, make_terms, open_env


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def upstream() -> CountingUpstream:
    return CountingUpstream()


@pytest.fixture
def env(sqlite_url: str, upstream: CountingUpstream) -> Iterator[Env]:
    e = open_env(sqlite_url, make_terms(), upstream_app=upstream)
    yield e
    close_env(e)
