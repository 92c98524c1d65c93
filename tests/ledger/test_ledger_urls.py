"""Ledger URLs: what holedger cannot store a ledger in is refused in one line, with a hint;
``postgresql://`` means the psycopg 3 driver holedger installs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from holedger.errors import ConfigError
from holedger.ledger.keys import SigningKey
from holedger.ledger.sql import ledger_url
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from ledger.recorded_run import record_run

KEY = SigningKey.generate("holedger-operator")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("bogus://x", "holedger cannot keep a ledger in 'bogus'"),
        ("mysql://user:secret@db/ledger", "holedger cannot keep a ledger in 'mysql'"),
        ("not a url", "not a database URL"),
        ("postgresql+psycopg2://u@h/d", r"cannot keep a ledger in 'postgresql\+psycopg2'"),
    ],
)
def test_unusable_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Ledger.open(url, KEY)
    assert "secret" not in str(caught.value)  # credentials are never echoed
    assert "sqlite:///PATH" in (caught.value.hint or "")


def test_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    init = [sys.executable, "-m", "holedger.cli", "--home", str(home), "init"]
    subprocess.run(init, check=True, capture_output=True)
    done = subprocess.run(
        [*init[:-1], "--ledger", "bogus://x", "run", "list"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("holedger: error: holedger cannot keep a ledger in 'bogus'")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_plain_postgresql_urls_use_psycopg_3(pg_url: str) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    assert ledger_url(plain) == pg_url
    ledger = Ledger.open(plain, KEY)
    try:
        assert ledger.app.engine.dialect.driver == "psycopg"
        assert ledger.url == pg_url
        run_id = record_run(ledger, rounds=1)
        assert replay_run(ledger, run_id, checks=()).verified
    finally:
        ledger.close()


def test_opening_a_home_whose_ledger_is_gone_creates_nothing(tmp_path: Path) -> None:
    from holedger.config import Settings

    settings = Settings.resolve(tmp_path / "home")
    Ledger.init_home(settings)
    db_file = settings.home / "ledger.db"
    db_file.unlink()
    with pytest.raises(ConfigError, match="no ledger at") as caught:
        Ledger.from_settings(settings)
    assert "holedger init" in (caught.value.hint or "")
    assert not db_file.exists()  # refused before anything could create it


@pytest.mark.parametrize(
    "args",
    [
        ["run", "list"],
        ["replay", "abcd1234"],
        ["export", "abcd1234", "-o", "out.hlb"],
        ["eval", "abcd1234", "seed", "--split", "dev"],
        ["analysis", "gains"],
    ],
)
def test_a_missing_home_is_named_alike_by_every_command(tmp_path: Path, args: list[str]) -> None:
    from click.testing import CliRunner

    from holedger.cli import cli

    home = tmp_path / "nowhere"
    result = CliRunner().invoke(cli, ["--home", str(home), *args])
    assert result.exit_code != 0
    assert result.output.splitlines() == [
        f"holedger: error: no holedger home at {home} (hint: run 'holedger init' to make it, "
        "or point --home or HOLEDGER_HOME at one)"
    ]
    assert not home.exists()  # nothing was created


def test_a_home_ledger_url_with_a_query_opens(tmp_path: Path) -> None:
    from holedger.config import Settings

    plain = Settings.resolve(tmp_path / "home")
    Ledger.init_home(plain)
    settings = Settings.resolve(plain.home, f"{plain.ledger_url}?timeout=5")
    Ledger.from_settings(settings).close()  # the query is not part of the file's name
