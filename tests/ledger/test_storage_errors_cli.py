"""Storage failures through the real command line (a subprocess each): a damaged SQLite
ledger (truncated, random bytes, a corrupted page, emptied), an unreachable PostgreSQL, a
full disk. Each is one line on stderr naming the ledger file or URL and what to do, with
its exit code, and no traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sample_terms import sha, task_terms

from holedger.config import Settings
from holedger.ledger.store import Ledger

REPO = Path(__file__).resolve().parents[2]


def holedger(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "holedger", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("holedger: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def good_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose ledger holds 200 runs (a file of many pages)."""
    home = tmp_path_factory.mktemp("good") / "home"
    assert holedger("--home", str(home), "init").returncode == 0
    ledger = Ledger.from_settings(Settings.resolve(home))
    try:
        for _ in range(200):
            ledger.open_run(task_terms(), task_digest=sha("task"))
    finally:
        ledger.close()
    with contextlib.closing(sqlite3.connect(home / "ledger.db")) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the one file
    assert (home / "ledger.db").stat().st_size > 200_000
    return home


def _damaged(good_home: Path, tmp_path: Path, how: str) -> Path:
    home = tmp_path / "home"
    shutil.copytree(good_home, home)
    db = home / "ledger.db"
    data = db.read_bytes()
    if how == "truncated":
        db.write_bytes(data[: len(data) * 3 // 5])
    elif how == "random":
        db.write_bytes(os.urandom(len(data)))
    elif how == "corrupt-page":
        middle = len(data) // 2
        db.write_bytes(data[:middle] + os.urandom(len(data) // 4) + data[middle + len(data) // 4 :])
    return home


@pytest.mark.parametrize(
    ("how", "command"),
    [
        ("truncated", "run list"),
        ("random", "replay RUN"),
        ("random", "init"),
        # a page in the middle: only a command that reads every run is sure to meet it
        ("corrupt-page", "run list"),
    ],
)
def test_a_damaged_sqlite_ledger_is_one_line(
    good_home: Path, tmp_path: Path, how: str, command: str
) -> None:
    run_id = Ledger.open(f"sqlite:///{good_home / 'ledger.db'}").run_ids()[0]
    home = _damaged(good_home, tmp_path, how)
    result = holedger("--home", str(home), *command.replace("RUN", run_id).split())
    line = one_line(result)
    assert result.returncode == 2
    assert f"the ledger file {home / 'ledger.db'} is damaged or not a holedger ledger" in line
    assert "restore it from a backup" in line


def test_a_damaged_ledger_with_json_is_one_json_error(good_home: Path, tmp_path: Path) -> None:
    import json

    home = _damaged(good_home, tmp_path, "random")
    result = holedger("--home", str(home), "run", "list", "--json")
    one_line(result)
    doc = json.loads(result.stdout)
    assert doc["error"]["exit_code"] == 2 and "is damaged" in doc["error"]["message"]


def test_an_emptied_ledger_beside_run_repositories_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert holedger("--home", str(home), "init").returncode == 0
    (home / "runs" / "0f0f0f0f-0000-4000-8000-000000000000.git").mkdir(parents=True)
    (home / "ledger.db").write_bytes(b"")
    for command in (["run", "list"], ["init"]):
        result = holedger("--home", str(home), *command)
        line = one_line(result)
        assert result.returncode == 2
        assert f"the ledger file {home / 'ledger.db'} is empty" in line
        assert "1 run repository" in line


def test_an_unreachable_postgresql_is_one_line_without_the_password(tmp_path: Path) -> None:
    url = "postgresql+psycopg://holedger:s3cretpw@127.0.0.1:1/ledger"
    home = tmp_path / "home"
    for command in (["init"], ["run", "list"]):
        result = holedger("--home", str(home), "--ledger", url, *command)
        if command == ["run", "list"]:
            # no key yet: the home is named first; make one and try again
            assert holedger("--home", str(home), "init").returncode == 0
            result = holedger("--home", str(home), "--ledger", url, *command)
        line = one_line(result)
        assert result.returncode == 2
        assert "127.0.0.1:1/ledger" in line and "s3cretpw" not in line
        assert "start the database server, or check --ledger" in line


OPEN_A_RUN = (
    'import sys; sys.path.insert(0, "tests"); from sample_terms import sha, task_terms; '
    "from holedger.config import Settings; from holedger.ledger.store import Ledger; "
    "ledger = Ledger.from_settings(Settings.resolve(sys.argv[1])); "
    'ledger.open_run(task_terms(), task_digest=sha("t")); ledger.close()'
)


def _full_disk_script(home: Path, mount: Path, commands: list[list[str]]) -> str:
    lines = [
        "set -u",
        f"mount -t tmpfs -o size=1m tmpfs {mount} || exit 99",
        f"{sys.executable} -m holedger --home {home} init >/dev/null || exit 98",
        f"{sys.executable} -c '{OPEN_A_RUN}' {home} || exit 97",
        f"dd if=/dev/zero of={mount}/filler bs=4k 2>/dev/null",
    ]
    for i, command in enumerate(commands):
        words = " ".join(command)
        lines.append(
            f"{sys.executable} -m holedger {words} >{mount.parent}/out{i} 2>{mount.parent}/err{i};"
            f" echo $? >{mount.parent}/rc{i}"
        )
    lines.append(f"ls -a {mount}/new/keys > {mount.parent}/newkeys 2>/dev/null; true")
    return "\n".join(lines)


def test_a_full_disk_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to mount a small private tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    home = mount / "home"
    commands = [
        ["--home", str(home), "run", "list"],  # no room for the ledger's shared memory file
        ["--home", str(mount / "new"), "init"],  # the key file cannot be written
        ["--home", str(home), "--ledger", f"sqlite:///{mount}/other.db", "init"],
    ]
    script = _full_disk_script(home, mount, commands)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    if done.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    results = []
    for i in range(len(commands)):
        rc = int((tmp_path / f"rc{i}").read_text())
        err = (tmp_path / f"err{i}").read_text()
        out = (tmp_path / f"out{i}").read_text()
        results.append((rc, one_line(subprocess.CompletedProcess([], rc, out, err))))
    (rc, line) = results[0]
    assert rc == 3 and f"the ledger file {home / 'ledger.db'}" in line
    assert "its disk is full" in line and "free space" in line
    (rc, line) = results[1]
    assert rc == 3 and f"cannot write the key file {mount / 'new/keys/operator.key'}" in line
    # no half-written key file is left to hide the cause next time
    assert "operator.key" not in (tmp_path / "newkeys").read_text()
    (rc, line) = results[2]
    assert rc == 3 and f"the ledger file {mount / 'other.db'}" in line and "disk is full" in line


def test_an_unexpected_error_is_one_line_and_the_traceback_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    import holedger.ledger.commands as commands
    from holedger.cli import cli

    runner = CliRunner()
    home = ["--home", str(tmp_path / "home")]
    assert runner.invoke(cli, [*home, "init"]).exit_code == 0

    def broken(ctx: object) -> None:
        raise KeyError("surprise\nsecond line")

    monkeypatch.setattr(commands, "open_ledger", broken)
    result = runner.invoke(cli, [*home, "run", "list"])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "holedger: error: internal error: KeyError: 'surprise\\nsecond line' (hint: this is "
        "a bug in holedger; run again with HOLEDGER_TRACEBACK=1 to see where, and report it)"
    ]
    monkeypatch.setenv("HOLEDGER_TRACEBACK", "1")
    result = runner.invoke(cli, [*home, "run", "list"])
    assert isinstance(result.exception, KeyError)


def test_a_file_system_error_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    import holedger.ledger.commands as commands
    from holedger.cli import cli

    runner = CliRunner()
    home = ["--home", str(tmp_path / "home")]
    assert runner.invoke(cli, [*home, "init"]).exit_code == 0
    missing = tmp_path / "gone" / "file.json"

    def broken(ctx: object) -> None:
        missing.read_text()

    monkeypatch.setattr(commands, "open_ledger", broken)
    result = runner.invoke(cli, [*home, "run", "list"])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2
    assert result.stderr.strip() == (
        f"holedger: error: {missing} does not exist (hint: check the path)"
    )
