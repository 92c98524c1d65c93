"""Progress of a long replay: `holedger replay` and `holedger verify` show a bar on a
terminal's stderr and print nothing more anywhere else; the engine reports how far it has
read, ending at the whole run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ledger.recorded_run import CHECKPOINT_INTERVAL, record_run
from terminal import run_on_terminal

from holedger.bundles import verify as bundle_module
from holedger.bundles.export import export_bundle
from holedger.bundles.verify import verify_bundle
from holedger.config import Settings
from holedger.ledger import store
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from replay.task_run import closed_task_run


@pytest.fixture()
def recorded(tmp_path: Path) -> Iterator[tuple[Ledger, str, Path]]:
    """A ledger holding a closed run of 219 events (integrity checks only: its
    other checks are other tests' business), and the run's bundle."""
    ledger = Ledger.open(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        SigningKey.generate("holedger-operator"),
        checkpoint_interval=CHECKPOINT_INTERVAL,
    )
    run_id = record_run(ledger)
    export_bundle(ledger, run_id, tmp_path / "run.hlb")
    yield ledger, run_id, tmp_path / "run.hlb"
    ledger.close()


@pytest.fixture()
def home(tmp_path: Path) -> tuple[Path, str, Path]:
    """A home holding a closed run that replay verifies whole, and its bundle."""
    settings = Settings.resolve(tmp_path / "home")
    Ledger.init_home(settings)
    ledger = Ledger.from_settings(settings)
    try:
        run_id = closed_task_run(ledger)
        export_bundle(ledger, run_id, tmp_path / "run.hlb")
    finally:
        ledger.close()
    return settings.home, run_id, tmp_path / "run.hlb"


def test_replay_reports_its_progress_up_to_the_whole_run(
    recorded: tuple[Ledger, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, run_id, _ = recorded
    events = ledger.stored_count(run_id)
    assert events == 219
    # replay reads 2 * READ_BATCH records at a time: several batches, so several reports
    monkeypatch.setattr(store, "READ_BATCH", 25)
    seen: list[tuple[int, int]] = []
    report = replay_run(
        ledger, run_id, checks=(), progress=lambda done, total: seen.append((done, total))
    )
    assert report.verified and report.events == events
    assert [done for done, _ in seen] == [50, 100, 150, 200, 219]
    assert {total for _, total in seen} == {events}


def test_bundle_verification_reports_its_progress(
    recorded: tuple[Ledger, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, run_id, bundle = recorded
    events = ledger.stored_count(run_id)
    monkeypatch.setattr(bundle_module, "PROGRESS_EVERY", 100)
    seen: list[tuple[int, int]] = []
    report = verify_bundle(
        bundle, checks=(), progress=lambda done, total: seen.append((done, total))
    )
    assert report.verified, report.failures
    assert seen == [(100, events), (200, events), (events, events)]


def _holedger(*args: str) -> list[str]:
    return [sys.executable, "-m", "holedger.cli", *args]


COMMANDS = {
    "replay": ["replay", "RUN"],
    "verify": ["verify", "BUNDLE"],
    "report": ["report", "RUN", "-o", "page.html"],
    "attest": ["attest", "RUN", "-o", "result.json"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_terminal_sees_the_bar_and_stdout_only_the_result(
    home: tuple[Path, str, Path], command: str
) -> None:
    path, run_id, bundle = home
    args = [{"RUN": run_id, "BUNDLE": str(bundle)}.get(a, a) for a in COMMANDS[command]]
    ran = run_on_terminal(_holedger("--home", str(path), *args), path.parent, columns=100)
    assert ran.code == 0, (ran.out, ran.err)
    assert b"checking events" in ran.err
    assert b"3/3" in ran.err  # fed to the end: every event of the run counted
    if command in ("replay", "verify"):
        assert b"VERIFIED (3 events)" in ran.out
    assert b"checking events" not in ran.out


@pytest.mark.parametrize("command", ["replay", "verify"])
def test_no_terminal_no_bar(home: tuple[Path, str, Path], command: str) -> None:
    path, run_id, bundle = home
    target = run_id if command == "replay" else str(bundle)
    done = subprocess.run(
        _holedger("--home", str(path), command, target, "--json"),
        cwd=path.parent,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""  # a pipe or a log file gets no bar
    assert done.stdout.lstrip().startswith(b"{")
