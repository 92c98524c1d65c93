"""Tables: boxed to fit a terminal; plain tab-separated lines, every cell whole, in a pipe."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

from report.synthetic_run import record_synthetic_run
from rich.console import Console

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.output import console, table

COLUMNS = ["run", "task", "optimizer", "note"]


def _rows() -> list[list[str]]:
    long_note = "a reason that goes on " * 12 + "[not markup]"
    return [[str(uuid.uuid4()), "officeqa-lite" * 3, "holedger-example-optimizer", long_note]]


def test_on_a_terminal_the_table_fits_its_width_and_ids_stay_whole() -> None:
    rows = _rows()
    for width in (60, 80, 120):
        buffer = io.StringIO()
        out = Console(file=buffer, width=width, force_terminal=True, color_system=None)
        out.print(table("runs", COLUMNS, rows, whole=("run",)))
        lines = buffer.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width, (width, lines)
        assert str(rows[0][0]) in buffer.getvalue()  # the id a user copies
        assert "…" in buffer.getvalue()  # the long note is cut short, not the id
        assert "\t" not in buffer.getvalue()


def test_in_a_pipe_each_row_is_one_line_of_whole_cells_separated_by_tabs() -> None:
    rows = [*_rows(), ["r2", "t", "o", "a\ttab, a\nnewline and a \\ backslash"]]
    buffer = io.StringIO()
    console(file=buffer).print(table("runs", COLUMNS, rows))  # the commands' console, no tty
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "# runs"
    assert lines[1].split("\t") == COLUMNS
    assert lines[2].split("\t") == [str(c) for c in rows[0]]  # every cell whole
    assert lines[3].split("\t") == ["r2", "t", "o", "a\\ttab, a\\nnewline and a \\\\ backslash"]
    assert len(lines) == 4
    assert not any(line != line.rstrip() for line in lines)  # no padding


def test_a_command_piped_prints_plain_lines_not_a_box(tmp_path: Path) -> None:
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    try:
        run_id = record_synthetic_run(ledger)
    finally:
        ledger.close()
    env = dict(os.environ, HOLEDGER_HOME=str(cfg.home))
    for name in ("HOLEDGER_LEDGER", "COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)

    def piped(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "holedger.cli", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr
        return done.stdout.splitlines()

    listed = piped("run", "list")
    header = listed[0].split("\t")
    assert header[:2] == ["run", "task"]
    [row] = [line.split("\t") for line in listed[1:]]
    assert row[0] == run_id and len(row) == len(header)
    replayed = piped("replay", run_id)
    assert not any(ch in "\n".join(replayed) for ch in "│┃━─")  # no box drawing
    at = replayed.index("# budget")
    assert replayed[at + 1].split("\t") == ["component", "used", "limit", "percent"]
    budget = {line.split("\t")[0]: line.split("\t")[1:] for line in replayed[at + 2 : at + 6]}
    # 3 dev requests of the synthetic run, 3 cases of 6 once each: 9/6 = 1.5 passes
    assert budget["dev case_passes"][0] == "1.5"
    assert max(len(line) for line in replayed) < 400  # whole cells, no padding to a width
