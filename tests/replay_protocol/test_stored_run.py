"""A run stored before refusal codes were recorded still verifies, from its database and
from its records, with the signing key pinned."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from holedger.ledger.keys import PublicKey
from holedger.ledger.store import Ledger
from holedger.replay.inputs import CheckInputs
from holedger.replay.runs import LedgerBlobs, replay_run, verify_records

from .runs import task_data

FIXTURE = Path(__file__).parent.parent / "fixtures" / "run_before_codes"
RUN_ID = (FIXTURE / "run_id").read_text().strip()


def _key() -> PublicKey:
    return PublicKey.from_vkey((FIXTURE / "server.vkey").read_text().strip())


def _records() -> list[bytes]:
    return (FIXTURE / "records.jsonl").read_bytes().splitlines()


def test_the_fixture_records_refusals_as_text_alone() -> None:
    requests = [
        json.loads(raw)["payload"]
        for raw in _records()
        if json.loads(raw)["type"] == "EvaluationRequested"
    ]
    rejected = [p for p in requests if p["decision"] == "rejected"]
    assert len(rejected) == 2
    assert all("code" not in p and p["reason"] for p in requests if p in rejected)


@pytest.mark.parametrize("fast", [True, False])
def test_a_run_stored_before_codes_verifies_from_its_database(tmp_path: Path, fast: bool) -> None:
    db = tmp_path / "ledger.db"
    shutil.copy(FIXTURE / "ledger.db", db)
    ledger = Ledger.open(f"sqlite:///{db}", create_tables=False)
    try:
        report = replay_run(
            ledger, RUN_ID, trusted_keys=[_key()], inputs=CheckInputs(task_data=task_data())
        )
        assert report.verified, report.failures
        budget = next(c for c in report.checks if c.name == "budget")
        assert budget.ok and "2 rejected" in budget.detail
        # and from its record bytes alone, reference pass or fast path
        again = verify_records(
            RUN_ID,
            _records(),
            LedgerBlobs(ledger),
            trusted_keys=[_key()],
            inputs=CheckInputs(task_data=task_data()),
            fast=fast,
        )
        assert again.verified, again.failures
    finally:
        ledger.close()


def test_a_refusal_text_changed_in_the_stored_run_is_caught(tmp_path: Path) -> None:
    # The same bytes with another rule's wording in a rejection: the signature breaks.
    records = [
        raw.replace(b"dev calls budget exceeded", b"dev case_passes budget exceeded")
        for raw in _records()
    ]
    db = tmp_path / "ledger.db"
    shutil.copy(FIXTURE / "ledger.db", db)
    ledger = Ledger.open(f"sqlite:///{db}", create_tables=False)
    try:
        report = verify_records(
            RUN_ID,
            records,
            LedgerBlobs(ledger),
            trusted_keys=[_key()],
            inputs=CheckInputs(task_data=task_data()),
        )
    finally:
        ledger.close()
    assert not report.verified
    assert any(f.check == "signatures" for f in report.failures), report.failures
