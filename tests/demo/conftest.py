"""One demo run for the whole demo suite: the README tour's first block, as written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .readme_tour import run_blocks, tour_blocks


@dataclass(frozen=True)
class TourState:
    folder: Path
    home: Path
    demo: dict[str, Any]
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def tour(tmp_path_factory: pytest.TempPathFactory) -> TourState:
    """Runs `holedger demo --json > demo.json` (the tour's first block) in a fresh folder."""
    folder = tmp_path_factory.mktemp("tour")
    first = tour_blocks()[0]
    assert "holedger demo --json" in first.body
    proc = run_blocks([first], folder, timeout=1500)
    demo_json = folder / "demo.json"
    if not demo_json.exists() or not demo_json.read_text().strip():
        pytest.fail(f"the demo wrote no JSON; stderr:\n{proc.stderr[-4000:]}")
    demo = json.loads(demo_json.read_text())
    return TourState(folder, folder / ".holedger", demo, proc.stdout, proc.stderr)
