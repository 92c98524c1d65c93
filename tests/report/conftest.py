"""Fixtures: a home holding one synthetic run, for the report tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from holedger.config import Settings
from holedger.ledger.store import Ledger

from .synthetic_run import record_synthetic_run


@pytest.fixture()
def home(tmp_path: Path) -> Iterator[tuple[Settings, str]]:
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    try:
        run_id = record_synthetic_run(ledger)
    finally:
        ledger.close()
    yield cfg, run_id
