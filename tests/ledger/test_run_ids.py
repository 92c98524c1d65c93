"""A run id is spelled one way only: events of a run spelled otherwise could never verify."""

from __future__ import annotations

import uuid

import pytest

from holedger.errors import UsageError
from holedger.ledger.store import Ledger
from holedger.replay.engine import replay_run
from holedger.schemas.events import CandidateNominated

from .recorded_run import open_run, task_terms


@pytest.mark.parametrize(
    "run_id",
    [
        str(uuid.uuid1()),  # another UUID version
        str(uuid.uuid4()).upper(),
        uuid.uuid4().hex,  # no hyphens
        "{" + str(uuid.uuid4()) + "}",
        "not a uuid",
    ],
)
def test_opening_a_run_under_another_spelling_is_refused(
    sqlite_ledger: Ledger, run_id: str
) -> None:
    with pytest.raises(UsageError, match="not a holedger run id"):
        sqlite_ledger.open_run(task_terms(), task_digest="ab" * 32, run_id=run_id)
    assert sqlite_ledger.run_ids() == []


def test_appending_under_another_spelling_is_refused(sqlite_ledger: Ledger) -> None:
    run_id = open_run(sqlite_ledger)
    event = CandidateNominated(candidate="0" * 40)
    with pytest.raises(UsageError, match="not a holedger run id"):
        sqlite_ledger.append(run_id.upper(), "CandidateNominated", event, "server")
    sqlite_ledger.close_run(run_id, reason="completed", summary={})
    report = replay_run(sqlite_ledger, run_id, projections=())
    assert report.verified and report.events == 3  # RunOpened, RunClosed, its checkpoint
