"""A closed ledger holds no file descriptor: a long-running process (``holedger serve``,
a gateway) that opens and closes ledgers keeps a steady count, without waiting for the
garbage collector to find what close left open."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from descriptors import descriptors_kept
from sample_terms import sha, task_terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger


def write_and_read(url: str, key: SigningKey) -> Callable[[], None]:
    def step() -> None:
        ledger = Ledger.open(url, key)
        try:
            run_id = ledger.open_run(task_terms("fd-task"), task_digest=sha("fd-task"))
            ledger.close_run(run_id)
            assert [r.type for r in ledger.records(run_id)][-2:] == ["RunClosed", "Checkpoint"]
        finally:
            ledger.close()

    return step


def test_a_closed_sqlite_ledger_holds_no_descriptor(tmp_path: Path) -> None:
    step = write_and_read(f"sqlite:///{tmp_path / 'ledger.db'}", SigningKey.generate("fd"))
    assert descriptors_kept(step) == 0


@pytest.mark.postgres
def test_a_closed_postgresql_ledger_holds_no_connection(pg_url: str) -> None:
    assert descriptors_kept(write_and_read(pg_url, SigningKey.generate("fd"))) == 0


def test_commands_run_in_process_close_what_they_open(tmp_path: Path) -> None:
    """The commands as a caller in the same process runs them (CliRunner, an embedding
    program): each closes its ledger."""
    home = tmp_path / "home"
    runner = CliRunner()
    assert runner.invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    ledger = Ledger.from_settings(Settings.resolve(home))
    try:
        run_id = ledger.open_run(task_terms("fd-task"), task_digest=sha("fd-task"))
        ledger.close_run(run_id)
    finally:
        ledger.close()

    def step() -> None:
        for args in (["run", "list"], ["replay", run_id], ["run", "show", run_id]):
            done = runner.invoke(cli, ["--home", str(home), *args])
            assert done.exit_code == 0, (args, done.output)

    assert descriptors_kept(step) == 0
