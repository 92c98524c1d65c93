"""The HTML report: well formed, self-contained, every section present, honest verdict."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.engine import replay_run
from holedger.replay.html import build_report, collect_run

from .html_checks import page_problems, parse_page


def _page(cfg: Settings, run_id: str) -> tuple[str, bool]:
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        report = replay_run(ledger, run_id)
        return build_report(ledger, run_id, report), report.verified
    finally:
        ledger.close()


def test_page_is_well_formed_self_contained_and_complete(home: tuple[Settings, str]) -> None:
    cfg, run_id = home
    page, _ = _page(cfg, run_id)
    assert page_problems(page) == []
    assert run_id in page
    assert f"holedger replay {run_id}" in page
    parser = parse_page(page)
    assert parser.tags.get("svg", 0) >= 4  # progress, tokens, held-out bars, g line


def test_checker_catches_external_resources_and_broken_markup() -> None:
    """The checks the other tests rely on do fail on what they are meant to catch."""
    good = "<!DOCTYPE html><html><body>" + "".join(
        f'<section id="{s}"></section>'
        for s in ("verdict", "budget", "candidates", "tokens", "held-out", "safety", "leakage")
    )
    good += "</body></html>"
    assert page_problems(good) == []
    assert page_problems(good.replace("<body>", '<body><img src="https://x.invalid/a.png">'))
    assert page_problems(good.replace("<body>", "<body><script>1</script>"))
    assert page_problems(good.replace("<body>", "<body><style>a{background:url(x.png)}</style>"))
    assert page_problems(good.replace("<body>", '<body><a href="http://x.invalid">x</a>'))
    assert page_problems(good.replace("</body>", "<div></body>"))
    assert page_problems(good.replace('id="safety"', 'id="other"'))


def test_page_shows_the_numbers_of_the_run(home: tuple[Settings, str]) -> None:
    cfg, run_id = home
    page, verified = _page(cfg, run_id)
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        data = collect_run(ledger, run_id)
    finally:
        ledger.close()
    # 3 candidates, 5 search requests + 1 held-out request, 3*3 + 2*6 + 5*2 trials
    assert [c.index for c in data.candidates] == [0, 1, 2]
    assert len(data.evaluations) == 6
    assert len(data.trials) == 31
    assert data.scored is not None
    assert "g = " in page
    assert "seed harness E(H0)" in page and "0.333" in page
    assert "timeout" in page  # the safety violation's category
    assert ("VERIFIED" in page) == verified


def test_tampered_run_page_says_it_failed_and_names_the_event(
    home: tuple[Settings, str], tmp_path: Path
) -> None:
    cfg, run_id = home
    db = cfg.home / "ledger.db"
    with sqlite3.connect(db) as conn:
        table = next(
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            if "event" in name
        )
        rowid, state = conn.execute(
            f"SELECT rowid, state FROM {table} WHERE originator_version = 5"
        ).fetchone()
        data = bytearray(state)
        data[len(data) // 2] ^= 0x01
        conn.execute(f"UPDATE {table} SET state = ? WHERE rowid = ?", (bytes(data), rowid))
    out = tmp_path / "tampered.html"
    result = CliRunner().invoke(
        cli, ["--home", str(cfg.home), "report", run_id, "-o", str(out), "--json"]
    )
    assert result.exit_code == 1, result.output
    page = out.read_text()
    assert "VERIFICATION FAILED" in page
    assert page_problems(page) == []
    assert "<td>FAIL</td>" in page


def test_report_command_writes_into_the_home_by_default(home: tuple[Settings, str]) -> None:
    cfg, run_id = home
    result = CliRunner().invoke(cli, ["--home", str(cfg.home), "report", run_id[:8], "--json"])
    assert result.exit_code in (0, 1), result.output
    path = cfg.reports_dir / f"{run_id}.html"
    assert path.is_file()
    assert str(path) in result.output


def test_unknown_run_is_one_line_with_exit_2(home: tuple[Settings, str]) -> None:
    cfg, _ = home
    result = CliRunner().invoke(cli, ["--home", str(cfg.home), "report", "ffffffff"])
    assert result.exit_code == 2
    assert "no run" in result.output


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "headless_shell"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_page_renders_in_headless_chromium(home: tuple[Settings, str], tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium installed (apt-get install chromium) to render the page")
    cfg, run_id = home
    page, _ = _page(cfg, run_id)
    html_file = tmp_path / "report.html"
    html_file.write_text(page)
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--window-size=1100,2400",
            f"--screenshot={shot}",
            html_file.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file(), proc.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a blank page compresses to far less
