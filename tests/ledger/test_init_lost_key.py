"""`holedger init` on a home whose key file is gone but whose runs are still there refuses,
naming the key id that signed them and how to restore it or start a new home; it never
makes a new operator identity over old runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from sample_terms import sha, task_terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger


def _init(home: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--home", str(home), *extra, "init"])
    return result.exit_code, result.output


def _home_with_runs(tmp_path: Path, n: int = 2) -> tuple[Settings, SigningKey]:
    home = tmp_path / "home"
    code, out = _init(home)
    assert code == 0, out
    settings = Settings.resolve(home)
    key = SigningKey.load(settings.key_path)
    ledger = Ledger.from_settings(settings)
    try:
        for _ in range(n):
            ledger.open_run(task_terms(), task_digest=sha("task"))
    finally:
        ledger.close()
    return settings, key


def test_init_refuses_a_home_with_runs_and_no_key(tmp_path: Path) -> None:
    settings, key = _home_with_runs(tmp_path)
    settings.key_path.unlink()
    code, out = _init(settings.home)
    assert code == 2
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    line = lines[0]
    assert line.startswith("holedger: error: the home ")
    assert "2 runs" in line
    assert f"key id {key.key_id_hex}" in line
    assert str(settings.key_path) in line
    assert "restore" in line and "--home NEW_DIR init" in line
    assert "Traceback" not in out
    assert not settings.key_path.exists()  # no new identity was made
    # the verifier key left in the home is named, so the right backup can be found
    assert key.public.vkey() in line


def test_init_refusal_without_the_verifier_key_file_and_as_json(tmp_path: Path) -> None:
    settings, key = _home_with_runs(tmp_path, n=1)
    settings.key_path.unlink()
    settings.pub_path.unlink()
    result = CliRunner().invoke(cli, ["--home", str(settings.home), "init", "--json"])
    assert result.exit_code == 2
    assert "1 run signed by" in result.output and key.key_id_hex in result.output
    doc = json.loads(result.stdout)
    assert doc["error"]["exit_code"] == 2 and key.key_id_hex in doc["error"]["message"]


def test_init_refuses_when_only_run_repositories_remain(tmp_path: Path) -> None:
    settings, _ = _home_with_runs(tmp_path, n=0)
    (settings.runs_dir / "0f0f0f0f-0000-4000-8000-000000000000.git").mkdir(parents=True)
    settings.key_path.unlink()
    code, out = _init(settings.home)
    assert code == 2 and "1 run signed by a key this home no longer names" in out


def test_init_still_makes_a_key_for_a_home_without_runs(tmp_path: Path) -> None:
    settings, old = _home_with_runs(tmp_path, n=0)
    settings.key_path.unlink()
    code, out = _init(settings.home)
    assert code == 0, out
    assert SigningKey.load(settings.key_path).key_id_hex != old.key_id_hex


def test_init_with_the_key_restored_keeps_it(tmp_path: Path) -> None:
    settings, key = _home_with_runs(tmp_path, n=1)
    backup = tmp_path / "backup.key"
    shutil.copy2(settings.key_path, backup)
    settings.key_path.unlink()
    assert _init(settings.home)[0] == 2
    shutil.copy2(backup, settings.key_path)
    code, out = _init(settings.home)
    assert code == 0 and "kept existing" in out
    assert SigningKey.load(settings.key_path).key_id_hex == key.key_id_hex
