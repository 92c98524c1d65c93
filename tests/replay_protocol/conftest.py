"""Fixtures: a fresh SQLite ledger signed by one key, and replay with the test task's data."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.inputs import CheckInputs
from holedger.replay.report import ReplayReport
from holedger.replay.runs import LedgerBlobs, replay_run, verify_records

from .runs import task_data


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    key = SigningKey.generate("replay-test")
    led = Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}", key, checkpoint_interval=16)
    yield led
    led.close()


@pytest.fixture
def replay(ledger: Ledger) -> Callable[..., ReplayReport]:
    def run(run_id: str, **given: Any) -> ReplayReport:
        given.setdefault("task_data", task_data())
        return replay_run(ledger, run_id, inputs=CheckInputs(**given))

    return run


class RedactedBlobs(LedgerBlobs):
    """Every blob left out, as in a bundle exported with ``--redact``."""

    def blob(self, digest: str) -> bytes | None:
        return None

    def redacted(self, digest: str) -> bool:
        return True


@pytest.fixture
def replay_redacted(ledger: Ledger) -> Callable[[str], ReplayReport]:
    """Replay as a verifier of a redacted bundle does: no blob bodies at hand."""

    def run(run_id: str) -> ReplayReport:
        records = (raw for _, raw in ledger.raw_records(run_id))
        inputs = CheckInputs(task_data=task_data())
        return verify_records(run_id, records, RedactedBlobs(ledger), inputs=inputs)

    return run
