"""The committed JSON Schemas match the models, and describe real recorded events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from holedger.schemas.events import EVENT_TYPES
from holedger.schemas.export import SCHEMA_DIR, drift, expected_files, main

from .recorded_run import record_run


def test_committed_schemas_match_the_models() -> None:
    problems = drift()
    assert not problems, (
        f"JSON Schemas drifted from the models: {problems}; "
        "regenerate with: python -m holedger.schemas.export"
    )


def test_every_event_type_the_envelope_and_the_report_are_exported() -> None:
    names = set(expected_files())
    wanted = {f"{t}.json" for t in EVENT_TYPES}
    wanted |= {"EventEnvelope.json", "SignedEvent.json", "TaskTerms.json", "ReplayReport.json"}
    assert wanted <= names


def test_drift_is_detected_and_regeneration_fixes_it(tmp_path: Path) -> None:
    assert main(["--dir", str(tmp_path)]) == 0
    assert drift(tmp_path) == []
    (tmp_path / "RunOpened.json").write_text("{}\n")
    (tmp_path / "Gone.json").write_text("{}\n")
    (tmp_path / "TaskTerms.json").unlink()
    assert drift(tmp_path) == [
        "missing TaskTerms.json",
        "left over Gone.json",
        "stale RunOpened.json",
    ]
    assert main(["--check", "--dir", str(tmp_path)]) == 1
    assert main(["--dir", str(tmp_path)]) == 0
    assert main(["--check", "--dir", str(tmp_path)]) == 0


def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Ledger, str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('schema') / 'ledger.db'}"
    ledger = Ledger.open(url, SigningKey.generate("holedger-operator"), checkpoint_interval=32)
    return ledger, record_run(ledger, rounds=2)


def test_recorded_records_validate_against_the_exported_schemas(
    recorded: tuple[Ledger, str],
) -> None:
    ledger, run_id = recorded
    signed_event = _validator("SignedEvent")
    seen = set()
    for rec in ledger.records(run_id):
        signed_event.validate(json.loads(rec.raw))
        _validator(rec.type).validate(rec.payload)
        seen.add(rec.type)
    assert {"RunOpened", "GatewayCall", "TrialCompleted", "Checkpoint", "RunClosed"} <= seen


def test_a_float_payload_is_invalid_under_the_schema(recorded: tuple[Ledger, str]) -> None:
    ledger, run_id = recorded
    trial = next(r for r in ledger.records(run_id) if r.type == "TrialCompleted")
    payload = dict(trial.payload, score=0.5)
    assert not _validator("TrialCompleted").is_valid(payload)


def test_the_replay_report_validates(recorded: tuple[Ledger, str]) -> None:
    ledger, run_id = recorded
    report = replay_run(ledger, run_id, checks=())
    _validator("ReplayReport").validate(report.model_dump(mode="json"))
