"""The HTML report: well formed, self-contained, every section present, honest verdict."""

from __future__ import annotations

import contextlib
import html
import json
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.html import (
    SECTION_IDS,
    Timeline,
    render_html,
    replay_timeline,
    with_sources,
    write_report,
)

from .html_checks import page_problems, parse_page
from .rich_run import record_rich_run


def _timeline(cfg: Settings, run_id: str) -> Timeline:
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        return replay_timeline(ledger, run_id)[1]
    finally:
        ledger.close()


def _page(cfg: Settings, run_id: str) -> tuple[str, bool]:
    timeline = _timeline(cfg, run_id)
    return render_html(timeline), timeline.verification.verified


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
        f'<section id="{s}"></section>' for s in SECTION_IDS
    )
    good += "</body></html>"
    assert page_problems(good) == []
    assert page_problems(good.replace("<body>", '<body><img src="https://x.invalid/a.png">'))
    assert page_problems(good.replace("<body>", "<body><script>1</script>"))
    assert page_problems(good.replace("<body>", "<body><style>a{background:url(x.png)}</style>"))
    assert page_problems(good.replace("<body>", '<body><a href="http://x.invalid">x</a>'))
    assert page_problems(good.replace("<body>", '<body><a href="//x.invalid/a">x</a>'))
    assert page_problems(good.replace("<body>", '<body><a href="/etc/passwd">x</a>'))
    assert page_problems(good.replace("<body>", '<body><a href="file:///x">x</a>'))
    # a link to a file beside the page (the optimizer log) loads nothing to render it
    assert page_problems(good.replace("<body>", '<body><a href="r.optimizer.jsonl">x</a>')) == []
    assert page_problems(good.replace("</body>", "<div></body>"))
    assert page_problems(good.replace('id="safety"', 'id="other"'))


def test_page_shows_the_numbers_of_the_run(home: tuple[Settings, str]) -> None:
    cfg, run_id = home
    page, verified = _page(cfg, run_id)
    data = _timeline(cfg, run_id)
    # 3 candidates, 5 search requests + 1 held-out request, 3*3 + 2*6 + 5*2 trials
    assert [c.index for c in data.candidates] == [0, 1, 2]
    assert len(data.evaluations) == 6
    assert len(data.trials) == 31
    assert data.held_out is not None
    assert "g = " in page
    assert "seed harness E(H0)" in page and "0.333" in page
    assert "timeout" in page  # the safety violation's category
    assert ("VERIFIED" in page) == verified


def test_tampered_run_page_says_it_failed_and_names_the_event(
    home: tuple[Settings, str], tmp_path: Path
) -> None:
    cfg, run_id = home
    db = cfg.home / "ledger.db"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:  # closed, and committed
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
    # only the events before the damaged one (seq 4) are folded into the tables and plots
    assert "what the tables and plots show is judged on seq 0 to 3 only, where the log" in page
    # (seq 3, the first dev trial, is the last one shown: 1 trial of 1000 tokens)
    assert "<td>dev</td><td>1</td><td>1000</td>" in page and "<td>val</td>" not in page
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


# Run in a copy of the page only (the page itself has no script): measures what a reader
# would see, and writes it into the DOM that --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const out = {sections: [...document.querySelectorAll('section')].map(s => s.id),
               pageWidth: document.documentElement.scrollWidth,
               viewWidth: document.documentElement.clientWidth,
               wide: [], cut: []};
  for (const el of document.querySelectorAll('section, table, pre, p, svg, details')) {
    if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) {
      out.wide.push(el.tagName + '#' + (el.closest('section') || {}).id);
    }
  }
  for (const svg of document.querySelectorAll('svg.plot')) {
    const vb = svg.viewBox.baseVal;
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBBox();
      if (b.x < vb.x - 0.5 || b.y < vb.y - 0.5 || b.x + b.width > vb.x + vb.width + 0.5 ||
          b.y + b.height > vb.y + vb.height + 0.5) {
        out.cut.push(t.textContent);
      }
    }
  }
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(browser: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            *args,
        ],
        capture_output=True,
        timeout=180,
        check=False,
    )


def test_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    """The page of a run with everything (diffs, prepared edits, a baseline run, an
    optimizer log, hostile text) rendered by a real browser: a screenshot is taken, every
    section is there, nothing is wider than the window, and no chart label is cut off."""
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium installed (apt-get install chromium) to render the page")
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    try:
        rich = record_rich_run(ledger, tmp_path)
        timeline = with_sources(replay_timeline(ledger, rich.run_id)[1], rich.sources)
        html_file = tmp_path / f"{rich.run_id}.html"
        write_report(timeline, html_file, rich.sources.optimizer_log)
    finally:
        ledger.close()
    page = html_file.read_text()
    assert page_problems(page) == []
    shot = tmp_path / "report.png"
    proc = _chromium(browser, "--window-size=1100,6000", f"--screenshot={shot}", html_file.as_uri())
    assert shot.is_file(), proc.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a blank page compresses to far less
    for width in (1100, 800):
        probed = tmp_path / f"probed-{width}.html"
        probed.write_text(page.replace("</body>", PROBE + "</body>"))
        proc = _chromium(
            browser,
            f"--window-size={width},2000",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probed.as_uri(),
        )
        dom = proc.stdout.decode(errors="replace")
        found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
        assert found, proc.stderr.decode(errors="replace")[-2000:]
        probe = json.loads(html.unescape(found.group(1)))
        assert set(SECTION_IDS) <= set(probe["sections"]), probe["sections"]
        assert probe["pageWidth"] <= probe["viewWidth"], (width, probe)
        assert probe["wide"] == [], (width, probe["wide"])
        assert probe["cut"] == [], (width, probe["cut"])


def test_page_shows_diffs_edits_baseline_and_log(tmp_path: Path) -> None:
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    try:
        rich = record_rich_run(ledger, tmp_path)
        timeline = with_sources(replay_timeline(ledger, rich.run_id)[1], rich.sources)
        page_path = tmp_path / f"{rich.run_id}.html"
        write_report(timeline, page_path, rich.sources.optimizer_log)
    finally:
        ledger.close()
    page = page_path.read_text()
    # candidate #1 is the prepared edit 03-retry-policy; #2 was changed by hand
    assert "= prepared edit 03-retry-policy (retry_timeout)" in page
    assert '<span class="da">+MAX_RETRIES = 4</span>' in page
    assert '<span class="dr">-MAX_RETRIES = 0</span>' in page
    assert "+2 −2 lines in 1 file" in page and "+2 −0 lines in 1 file" in page
    assert '<span class="da">+    return 42</span>' in page
    # the baseline's per-case scores beside the nominee's, and both error bars
    at = page.index("per-case held-out scores, nominee beside the seed baseline")
    table = page[at : page.index("</details>", at)]
    assert "syn-test-000</td><td>1.000 1.000</td><td>1.000</td><td>1.000 0.000</td>" in table
    assert "syn-test-001</td><td>1.000 0.500</td><td>0.750</td><td>0.000 0.444</td>" in table
    assert re.search(r"seed harness E\(H0\).*?±", page, re.S)
    assert "±1 standard error of the K round means" in page or "±1 standard error" in page
    # the optimizer log, linked beside the page
    assert f"<a href='{rich.run_id}.optimizer.jsonl'>" in page
    # per-case dev results per candidate
    at = page.index("Per-case dev results per candidate")
    assert "syn-dev-000" in page[at : page.index("</table>", at)]
    # splits never on one chart
    for svg_el in re.findall(r"<svg.*?</svg>", page, re.S):
        splits = set(re.findall(r'class="(?:pt|bar|trend) (dev|val|test)"', svg_el))
        assert len(splits) <= 1, splits
    # hostile text from the ledger is escaped, control bytes shown as escapes
    assert "<script>" not in page and "\x1b" not in page and "\x07" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; \\x1b[31mred" in page
    # no raw key-value dump
    assert "<dl>" not in page and "{&quot;" not in page
