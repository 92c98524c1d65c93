"""Untrusted text (a DNS name a harness asks for, a path, a model name, an output) is stored
escaped and shown escaped: no raw control character, escape sequence or bidi override of it
reaches a terminal, a pipe or the HTML report."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.errors import UsageError
from holedger.ledger.store import Ledger
from holedger.output import console, table
from holedger.replay.html import render_html, replay_timeline
from holedger.sandboxes.spec import Backend, Limits, Observation, SandboxSpec
from holedger.schemas.events import SafetyViolation
from holedger.untrusted import escape_text, is_safe

HOSTILE = "\x1b[2J\x1b]0;pwned\x07\u202eevil\u200b\x9b31m\n\r\x00"


def test_escape_text_leaves_no_unsafe_character() -> None:
    out = escape_text(HOSTILE)
    assert is_safe(out) and not is_safe(HOSTILE)
    assert out == "\\x1b[2J\\x1b]0;pwned\\x07\\u202eevil\\u200b\\x9b31m\\x0a\\x0d\\x00"
    assert escape_text("plain \\ text é 名") == "plain \\ text é 名"  # nothing else changes
    assert escape_text("a\nb\tc", keep="\n\t") == "a\nb\tc"
    assert escape_text("\ud800") == "\\ud800"  # a lone surrogate
    assert escape_text("\U000e0041") == "\\U000e0041"  # a tag character


def test_observations_store_their_detail_escaped() -> None:
    obs = Observation("network_attempt", f"dns query for {HOSTILE}")
    assert is_safe(obs.detail)
    assert obs.detail.startswith("dns query for \\x1b[2J")


DNS = r"""
import socket, struct
name = b"\x1b[2J\x1b]0;pwned\x07evil"
query = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0)
query += bytes([len(name)]) + name + b"\x07example\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(query, ("127.0.0.1", 53))
try:
    s.recv(512)
except OSError:
    pass
print("asked")
"""


@pytest.mark.slow
def test_a_dns_name_chosen_by_the_harness_is_stored_escaped(
    isolating: Backend, tmp_path: Path
) -> None:
    (tmp_path / "harness.py").write_text(DNS)
    result = isolating.run(
        SandboxSpec(
            code_dir=tmp_path,
            argv=["python3", "harness.py"],
            limits=Limits(wall_s=30),
            label="dns-escape",
        )
    )
    assert result.exit_status == 0, result.stderr
    dns = [o.detail for o in result.observations if o.detail.startswith("dns query for")]
    assert dns, result.observations
    assert all(is_safe(d) for d in dns)
    assert "\\x1b[2J\\x1b]0;pwned\\x07evil" in dns[0]


@pytest.fixture()
def hostile_run(tmp_path: Path) -> tuple[Settings, str]:
    """A run whose ledger holds a SafetyViolation with raw control bytes in its detail, as
    a writer that did not escape it would have stored it."""
    from tests.report.synthetic_run import record_synthetic_run

    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    try:
        run_id = record_synthetic_run(ledger, close=False)
        violation = SafetyViolation(category="network_attempt", detail=f"dns query for {HOSTILE}")
        ledger.append(run_id, "SafetyViolation", violation, "server")
    finally:
        ledger.close()
    return cfg, run_id


def test_the_html_report_shows_it_escaped(hostile_run: tuple[Settings, str]) -> None:
    cfg, run_id = hostile_run
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        page = render_html(replay_timeline(ledger, run_id)[1])
    finally:
        ledger.close()
    assert is_safe(page, keep="\n")
    assert "\\x1b[2J\\x1b]0;pwned\\x07\\u202eevil" in page


@pytest.mark.parametrize("command", [["replay", "RUN"], ["report", "RUN"], ["run", "show", "RUN"]])
def test_commands_print_no_raw_control_characters(
    hostile_run: tuple[Settings, str], command: list[str]
) -> None:
    cfg, run_id = hostile_run
    words = [w.replace("RUN", run_id) for w in command]
    result = CliRunner().invoke(cli, ["--home", str(cfg.home), *words])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert is_safe(result.output, keep="\n\t"), result.output
    json_result = CliRunner().invoke(cli, ["--home", str(cfg.home), *words, "--json"])
    assert is_safe(json_result.stdout, keep="\n\t")
    json.loads(json_result.stdout)


def test_tables_and_errors_show_it_escaped() -> None:
    for terminal in (True, False):
        out = console(file=io.StringIO(), force_terminal=terminal)
        out.print(table("t", ["detail"], [[HOSTILE]]))
        out.print(HOSTILE, markup=False)
        text = out.file.getvalue()  # type: ignore[attr-defined]
        shown = text.replace("\x1b[0m", "").replace("\x1b[1m", "").replace("\x1b[3m", "")
        assert "\x07" not in text and "\u202e" not in text
        assert "\x1b[2J" not in shown and "\x1b]0" not in shown
    line = UsageError(f"no run {HOSTILE}", hint=HOSTILE).one_line()
    assert is_safe(line)
