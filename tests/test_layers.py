"""The import layers of docs/ARCHITECTURE.md hold: import-linter checks the contracts in
pyproject.toml (rooms import only the rooms below them; no import cycle between the
modules of a room), so an upward import or a new cycle fails here."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from importlinter import cli

import holedger

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_contracts_are_kept() -> None:
    assert Path(holedger.__file__).resolve().is_relative_to(ROOT)  # the tree under test
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    assert code == 0, out.getvalue()
