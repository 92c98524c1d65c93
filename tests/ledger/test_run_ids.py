"""A run id is spelled one way only: events of a run spelled otherwise could never verify."""

from __future__ import annotations

import uuid

import pytest

from holedger.errors import UsageError
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
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
    ids=["uuid1", "upper-case", "no-hyphens", "braces", "not-a-uuid"],  # the same in every worker
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
    report = replay_run(sqlite_ledger, run_id, checks=())
    assert report.verified and report.events == 3  # RunOpened, RunClosed, its checkpoint


def test_run_list_prints_run_ids_whole_however_narrow_the_output() -> None:
    """The columns a user copies (run id, events, state) are never shortened."""
    import io
    import uuid

    from rich.console import Console

    from holedger.output import table

    run_id = str(uuid.uuid4())
    rows = [[run_id, "officeqa-lite" * 3, "holedger-example-optimizer", 585, "closed", "x" * 27]]
    columns = ["run", "task", "optimizer", "events", "state", "opened"]
    buffer = io.StringIO()
    Console(file=buffer, width=60, force_terminal=True).print(
        table(None, columns, rows, whole=("run", "state"))
    )
    assert run_id in buffer.getvalue()
    assert " closed " in buffer.getvalue()
    narrow = io.StringIO()
    Console(file=narrow, width=60, force_terminal=True).print(table(None, columns, rows))
    assert run_id not in narrow.getvalue()  # what the whole columns prevent


def test_a_malformed_run_id_is_bad_usage_and_an_unknown_one_not_found(
    sqlite_ledger: Ledger,
) -> None:
    from holedger.errors import NotFoundError

    run_id = open_run(sqlite_ledger)
    for spelling in (run_id, run_id[:8], run_id[:9], run_id[:13], run_id.upper()[:18]):
        assert sqlite_ledger.resolve_run(spelling) == run_id
    for malformed in ("not-a-uuid", run_id[:8] + "x", "{" + run_id + "}", run_id + "0"):
        with pytest.raises(UsageError, match="not a run id") as caught:
            sqlite_ledger.resolve_run(malformed)
        assert "holedger run list" in (caught.value.hint or "")
    unknown = "0" * 8 if not run_id.startswith("0" * 8) else "f" * 8
    with pytest.raises(NotFoundError, match=f"no run {unknown}"):
        sqlite_ledger.resolve_run(unknown)
