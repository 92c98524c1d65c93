"""The analysis report: one self-contained page (no script, nothing fetched) with a plot
per analysis, axes labelled, rendered in real Chromium at a laptop's width with nothing
overflowing the page."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from report.html_checks import parse_page

from holedger.analysis.report import SECTIONS
from holedger.cli import cli

from .grid_home import grid_home


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("grid")
    home = grid_home(root)
    out = root / "grid.html"
    args = ["--home", str(home), "analysis", "report", "-o", str(out), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["sections"] == [name for name, _, _ in SECTIONS]
    return out, out.read_text()


def test_page_is_self_contained_with_a_labelled_plot_per_analysis(page: tuple[Path, str]) -> None:
    _, html = page
    parser = parse_page(html)
    assert not parser.errors and not parser.stack
    for tag in ("script", "link", "img", "iframe", "object", "embed"):
        assert not parser.tags.get(tag), tag
    assert all(value.startswith("#") for _, _, value in parser.resources)
    assert "url(" not in "".join(parser.style_text)
    for name, _, _ in SECTIONS:
        assert name in parser.ids
    # every section has a plot: grid (2 tasks), lss, native, ladder, levers is not at hand
    # for runs without trees, optimism, frontier (2 tasks), budget
    assert parser.tags.get("svg", 0) >= 9
    for label in (
        "normalized gain g",
        "lambda-hat (gain units)",
        "g on the native harness",
        "release (in order within each family)",
        "E(H+) on test (y)",
        "optimizer tokens (log scale)",
        "case-pass usage (passes / allowance)",
    ):
        assert label in html
    assert html.count("reading, not stated") >= 5


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "headless_shell"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _png_rows(data: bytes) -> tuple[int, int, list[bytes], int]:
    """(width, height, raw unfiltered rows, bytes per pixel) of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows, channels


def test_page_renders_in_chromium_with_nothing_beyond_its_column(
    page: tuple[Path, str], tmp_path: Path
) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium installed to render the page")
    path, _ = page
    shot = tmp_path / "grid.png"
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,6000",
            f"--screenshot={shot}",
            path.as_uri(),
        ],
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert shot.is_file(), proc.stderr.decode(errors="replace")[-2000:]
    width, height, rows, channels = _png_rows(shot.read_bytes())
    assert width == 1280
    # The column is at most 960 px wide and centred: at 1280 px nothing may be drawn in
    # the outer 140 px of either side (the page background is #fafafa).
    background = bytes([0xFA, 0xFA, 0xFA])
    for y in range(0, height, 7):
        row = rows[y]
        for x in list(range(0, 140, 5)) + list(range(width - 140, width, 5)):
            assert row[x * channels : x * channels + 3] == background, (x, y)
    # and the page is not blank: many distinct colours inside the column
    colours = {
        rows[y][x * channels : x * channels + 3]
        for y in range(0, height, 13)
        for x in range(200, 1080, 9)
    }
    assert len(colours) > 20
