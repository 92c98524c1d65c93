"""What the optimizer and its harness send can never make a run unrecordable or unreplayable.

Each event is canonical JSON: text must be UTF-8, integers within 2**53, nesting within 64
levels. A value that breaks one of these after the request was recorded would leave the
run half-written (charged, its trials and projection missing) and failing replay for good;
one that makes replay list pairs without end would make the run impossible to audit. Each
test sends such a value and checks that it is refused up front, or recorded so that the
run still replays.
"""

from __future__ import annotations

import pytest

from holedger.errors import HoledgerError, UsageError
from holedger.protocol.answers import MAX_ANSWER_DEPTH
from holedger.server import MAX_ATTEMPTS
from holedger.server.candidates import (
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    CandidateRefused,
    FileEntry,
    read_directory,
)
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .helpers import assert_replay_verifies


def test_attempts_beyond_any_budget_are_refused_unrecorded(service: RunService) -> None:
    run_id = service.open_run("tiny").run_id
    before = len(list(service.ledger.records(run_id)))
    for attempts in (MAX_ATTEMPTS + 1, 2**52, 2**60):
        with pytest.raises(UsageError, match="attempts must be at most"):
            service.evaluate(run_id, "seed", "dev", None, attempts)
    assert len(list(service.ledger.records(run_id))) == before


def test_a_rejected_request_with_many_attempts_replays_without_listing_them(
    service: RunService,
) -> None:
    # Within the server's bound but far over the budget: recorded as rejected; replay
    # checks it without listing its case ids x attempts (it has no trials).
    run_id = service.open_run("tiny").run_id
    with pytest.raises(HoledgerError):
        service.evaluate(run_id, "seed", "dev", None, MAX_ATTEMPTS)
    [request] = [r for r in service.ledger.records(run_id) if r.type == "EvaluationRequested"]
    assert request.payload["decision"] == "rejected"
    assert request.payload["attempts"] == MAX_ATTEMPTS
    service.nominate(run_id, "seed")
    assert_replay_verifies(service.ledger, run_id)


def test_an_answer_too_deep_for_its_projection_is_no_answer_and_the_run_replays(
    service: RunService, tiny: ServerTask
) -> None:
    run_id = service.open_run("tiny").run_id
    for depth in (MAX_ANSWER_DEPTH, MAX_ANSWER_DEPTH + 1, 59, 64):
        files = read_directory(tiny.seed_dir)
        main = f"print('[' * {depth} + ']' * {depth})\n"
        files["harness/__main__.py"] = FileEntry(main.encode())
        candidate = service.commit_candidate(run_id, files).candidate
        evaluation = service.evaluate(run_id, candidate, "dev", ["dev-1"], 1)
        [trial] = evaluation.projection["cases"]["dev-1"]["trials"]
        assert (trial["answer"] is not None) == (depth <= MAX_ANSWER_DEPTH), depth
    service.nominate(run_id, "seed")
    assert_replay_verifies(service.ledger, run_id)


@pytest.mark.parametrize(
    "path",
    [
        "harness/bad-\udcff.py",  # a non-UTF-8 byte as a folder read gives it
        "harness/\ud800.py",  # a lone surrogate, as JSON can spell one
        "harness/" + "n" * (MAX_NAME_BYTES + 1),
        "/".join(["d" * 200] * (MAX_PATH_BYTES // 200 + 1)),
    ],
    ids=["non-utf8", "surrogate", "long-name", "long-path"],
)
def test_paths_no_event_should_hold_are_refused(
    service: RunService, tiny: ServerTask, path: str
) -> None:
    run_id = service.open_run("tiny").run_id
    before = len(list(service.ledger.records(run_id)))
    files = read_directory(tiny.seed_dir)
    files[path] = FileEntry(b"x")
    with pytest.raises(CandidateRefused) as refused:
        service.commit_candidate(run_id, files)
    assert len(list(service.ledger.records(run_id))) == before
    if "\udcff" in path:  # named by the byte the folder holds, not Python's stand-in
        assert "\\xff" in refused.value.message and "udcff" not in refused.value.message


def test_names_at_the_limits_are_committed(service: RunService, tiny: ServerTask) -> None:
    run_id = service.open_run("tiny").run_id
    files = read_directory(tiny.seed_dir)
    files["notes/" + "é" * (MAX_NAME_BYTES // 2)] = FileEntry(b"x")
    committed = service.commit_candidate(run_id, files)
    assert committed.candidate


@pytest.mark.parametrize("label", ["", "bad\udcff", "tab\there", "x" * 201])
def test_an_unprintable_optimizer_label_is_refused_before_anything_is_made(
    service: RunService, label: str
) -> None:
    runs = set(service.ledger.run_ids())
    repos = set(service.settings.run_repo("x").parent.iterdir())
    with pytest.raises(UsageError, match="optimizer label"):
        service.open_run("tiny", optimizer=label)
    assert set(service.ledger.run_ids()) == runs
    assert set(service.settings.run_repo("x").parent.iterdir()) == repos
