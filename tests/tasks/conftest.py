"""Shared fixtures of the tasks room's tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from holedger.tasks.loader import BUNDLED_DIR

VERO_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vero-partitions"
VERO_TASKS = ("officeqa", "browsecomp-plus", "terminal-bench", "gaia")


@pytest.fixture
def vero_dir() -> Path:
    if not VERO_DIR.is_dir():
        pytest.skip("the shared VeRO partitions (../shared/data/vero-partitions) are absent")
    return VERO_DIR.resolve()


@pytest.fixture
def task_copy(tmp_path: Path) -> Path:
    """A writable copy of the bundled officeqa-lite task folder."""
    dest = tmp_path / "officeqa-lite"
    shutil.copytree(
        BUNDLED_DIR / "officeqa-lite", dest, ignore=shutil.ignore_patterns("__pycache__")
    )
    return dest
