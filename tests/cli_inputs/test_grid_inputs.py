"""Campaign grid files with what a descriptor cannot sign (a release that is neither an
ordinal nor a date, a control character in a model name) are refused before anything is
made, as one line with a hint, exit 2; a grid saved with a byte-order mark reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.demo.grid import load_grid
from holedger.errors import UsageError

GRID = """[campaign]
name = "g1"
tasks = ["officeqa-lite"]
[common]
harness = "example-greedy"
[[optimizer]]
model = "MODEL"
release = "RELEASE"
"""


def _grid(tmp_path: Path, model: str = "m1", release: str = "1", bom: bool = False) -> Path:
    path = tmp_path / "grid.toml"
    text = GRID.replace("MODEL", model).replace("RELEASE", release)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


@pytest.mark.parametrize(
    ("model", "release", "needle"),
    [
        ("m1", "v2", "release 'v2' cannot be signed"),
        ("m1", "2026-5-1", "release '2026-5-1' cannot be signed"),
        ("m\\u0007x", "1", "model 'm\\x07x' cannot be signed"),
        ("m" * 201, "1", "model"),
    ],
)
def test_a_cell_no_descriptor_can_sign_is_refused_when_read(
    tmp_path: Path, model: str, release: str, needle: str
) -> None:
    with pytest.raises(UsageError) as err:
        load_grid(_grid(tmp_path, model, release))
    assert needle in err.value.one_line() and "grid.toml" in err.value.one_line()


def test_the_campaign_refuses_it_before_making_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["--home", str(home), "campaign", "run", str(_grid(tmp_path, release="v2"))]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "release 'v2'" in result.stderr and "(hint: " in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not home.exists()


def test_a_grid_saved_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    grid = load_grid(_grid(tmp_path, bom=True))
    assert [(c.model, c.release) for c in grid.cells] == [("m1", "1")]
