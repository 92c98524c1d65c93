"""A missing, unreadable or malformed file of a task folder, through the command line: one
line naming the file and what to do, exit 2, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from holedger.cli import cli

REPO = Path(__file__).resolve().parents[2]


def one_line(result: Result) -> str:
    # Only a deliberate exit: an exception escaping the command would be a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("holedger: error: ")
    return lines[0]


def _delete(rel: str) -> Callable[[Path], Path]:
    def change(task: Path) -> Path:
        target = task / rel
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
        return target

    return change


def _write(rel: str, data: bytes) -> Callable[[Path], Path]:
    def change(task: Path) -> Path:
        (task / rel).write_bytes(data)
        return task / rel

    return change


def _directory(rel: str) -> Callable[[Path], Path]:
    def change(task: Path) -> Path:
        (task / rel).unlink()
        (task / rel).mkdir()
        return task / rel

    return change


CASES = {
    "verifier deleted": (_delete("verifier.py"), "is missing"),
    "verifier is a directory": (_directory("verifier.py"), "cannot read"),
    "manifest deleted": (_delete("manifest.json"), "is missing"),
    "manifest not JSON": (_write("manifest.json", b"{nope"), "is malformed"),
    "cases file deleted": (_delete("cases/val.json"), "is missing"),
    "cases not JSON": (_write("cases/dev.json", b'[{"id": "a",'), "not valid JSON"),
    "cases not UTF-8": (_write("cases/test.json", b"\xff\xfe[]"), "not UTF-8"),
    "cases not an array": (_write("cases/dev.json", b'{"id": "a"}'), "must be a JSON array"),
    "case without id": (_write("cases/dev.json", b'[{"input": {}}]'), "has no string id"),
    "case with extra keys": (
        _write("cases/dev.json", b'[{"id": "a", "input": {}, "expected": 1, "x": 2}]'),
        "must have exactly id, input",
    ),
    "seed deleted": (_delete("seed"), "seed folder"),
    "task.toml not TOML": (_write("task.toml", b"id = ["), "is not readable TOML"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("command", ["tasks verify", "tasks verify --json"])
def test_a_bad_task_file_is_one_line_naming_it(task_copy: Path, name: str, command: str) -> None:
    change, words = CASES[name]
    path = change(task_copy)
    result = CliRunner().invoke(cli, [*command.split(), str(task_copy)])
    line = one_line(result)
    assert result.exit_code == 2, line
    assert str(path) in line, line
    assert words in line
    assert "(hint: " in line
    if "--json" in command:
        doc = json.loads(result.stdout)
        assert doc["error"]["exit_code"] == 2 and str(path) in doc["error"]["message"]


def test_run_open_names_the_missing_verifier(task_copy: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    home = ["--home", str(tmp_path / "home")]
    assert runner.invoke(cli, [*home, "init"]).exit_code == 0
    (task_copy / "verifier.py").unlink()
    result = runner.invoke(cli, [*home, "run", "open", "--task", str(task_copy)])
    line = one_line(result)
    assert result.exit_code == 2 and str(task_copy / "verifier.py") in line


def test_a_real_process_prints_no_traceback(task_copy: Path) -> None:
    """The same through a real ``holedger`` process: stderr is the one line."""
    (task_copy / "verifier.py").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "holedger", "tasks", "verify", str(task_copy)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"holedger: error: the task's verifier {task_copy / 'verifier.py'} is missing "
        "(hint: restore it from the task's source, or point task.toml at the right file)"
    ]
