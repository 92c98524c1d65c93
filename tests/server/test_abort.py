"""`holedger run abort`: every run can be finished, and then verifies as aborted.

A run whose optimizer stopped stays open, and an open run never verifies. Aborting records
what a stopped server left without trials (as `run recover` does), then a signed RunClosed
with reason "aborted" and no score; replay verifies such a run as "verified-aborted", and
the analyses leave it out, saying why.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from holedger.analysis.gains import collect
from holedger.cli import cli
from holedger.errors import PolicyError, UsageError
from holedger.replay.runs import replay_run
from holedger.server.core import ServerCore
from holedger.server.lifecycle import abort_run
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .helpers import perfect_candidate


def _aborted_verifies(service: RunService, run_id: str) -> Any:
    report = replay_run(service.ledger, run_id)
    failed = [(c.name, c.detail) for c in report.checks if not c.ok and c.level == "error"]
    assert report.verified, failed
    assert report.aborted and report.verdict == "verified-aborted"
    assert report.to_json()["verdict"] == "verified-aborted"
    return report


def _stop_before_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next trials do not run: as a server killed after recording a request."""

    def stop(*_: Any, **__: Any) -> Any:
        monkeypatch.undo()
        raise KeyboardInterrupt

    monkeypatch.setattr(ServerCore, "run_trials", stop)


def test_an_open_run_is_closed_as_aborted_and_verifies_so(
    fresh_service: RunService, tiny: ServerTask
) -> None:
    service = fresh_service
    run_id = service.open_run("tiny").run_id
    service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
    assert not replay_run(service.ledger, run_id).verified  # open: never verifies

    done = abort_run(service, run_id, "the optimizer crashed")
    assert done.recovered == [] and done.nominated is None
    report = _aborted_verifies(service, run_id)
    assert report.sections["closed"] == {"reason": "aborted", "why": "the optimizer crashed"}
    [closed] = [r for r in service.ledger.records(run_id) if r.type == "RunClosed"]
    assert closed.payload["reason"] == "aborted"
    assert "e_h_plus" not in closed.payload["summary"] and "g" not in closed.payload["summary"]
    [info] = [i for i in service.ledger.runs() if i.run_id == run_id]
    assert info.state == "aborted"
    with pytest.raises(PolicyError, match="already closed"):
        abort_run(service, run_id, "again")


def test_a_request_left_without_trials_is_recorded_first(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = fresh_service
    run_id = service.open_run("tiny").run_id
    _stop_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.evaluate(run_id, "seed", "dev", ["dev-1", "dev-2"], 1)
    assert service.states.current(run_id).pending

    done = abort_run(service, run_id, "interrupted")
    assert len(done.recovered) == 1
    _aborted_verifies(service, run_id)
    types = [r.type for r in service.ledger.records(run_id)]
    assert types.count("TrialCompleted") == 2
    assert types.index("DisclosureProjected") < types.index("RunClosed")


def test_a_nomination_cut_short_is_aborted_unscored(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = fresh_service
    run_id = service.open_run("tiny").run_id
    best = perfect_candidate(service, run_id, tiny)
    _stop_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.nominate(run_id, best)
    state = service.states.current(run_id)
    assert state.nominated == best and state.heldout is not None and state.scored is None

    done = abort_run(service, run_id, "no time to score it")
    assert done.nominated == best and not done.scored
    report = _aborted_verifies(service, run_id)
    scores = {c.name: c.detail for c in report.checks}["scores"]
    assert "aborted before it was scored" in scores
    trials = {c.name: c.detail for c in report.checks}["trials_match_requests"]
    assert "cut short by the abort" in trials


def test_an_unscored_nomination_of_a_completed_run_still_fails(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tolerance is for aborted runs only: a run closed as completed with its
    held-out scoring missing fails, as before."""
    service = fresh_service
    run_id = service.open_run("tiny").run_id
    _stop_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.nominate(run_id, "seed")
    service.ledger.close_run(run_id, "completed", {})
    report = replay_run(service.ledger, run_id)
    assert not report.verified and report.verdict == "failed"
    assert {"scores", "trials_match_requests"} <= set(report.failed_checks())


def test_a_reason_is_required_and_printable(fresh_service: RunService, tiny: ServerTask) -> None:
    run_id = fresh_service.open_run("tiny", baseline=False).run_id
    with pytest.raises(UsageError):
        abort_run(fresh_service, run_id, "   ")
    with pytest.raises(UsageError):
        abort_run(fresh_service, run_id, "bell\x07")
    assert not fresh_service.states.current(run_id).closed


def test_the_cli_aborts_lists_replays_and_leaves_it_out_of_analyses(
    fresh_service: RunService, tiny: ServerTask
) -> None:
    service = fresh_service
    home = str(service.settings.home)
    scored = service.open_run("tiny").run_id
    service.nominate(scored, perfect_candidate(service, scored, tiny))
    run_id = service.open_run("tiny").run_id
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["--home", home, *args])

    result = run("run", "abort", run_id, "--reason", "given up", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["state"] == "aborted"

    listed = {r["run_id"]: r["state"] for r in json.loads(run("run", "list", "--json").output)}
    assert listed[run_id] == "aborted" and listed[scored] == "closed"
    text = run("run", "list").output
    assert "aborted" in text

    replay = run("replay", run_id)
    assert replay.exit_code == 0, replay.output
    assert "VERIFIED (aborted)" in replay.output and "given up" in replay.output
    replay_json = json.loads(run("replay", run_id, "--json").output)
    assert replay_json["verdict"] == "verified-aborted" and replay_json["aborted"] is True

    page = service.settings.home / "page.html"
    reported = run("report", run_id, "-o", str(page), "--json")
    assert reported.exit_code == 0 and json.loads(reported.output)["verdict"] == "verified-aborted"
    assert "VERIFIED (aborted" in page.read_text()

    statement = service.settings.home / "aborted.intoto.json"
    attested = run("attest", run_id, "-o", str(statement), "--json")
    assert attested.exit_code == 0, attested.output
    vkey = service.settings.home / "keys" / "operator.pub"
    checked = run("verify-attestation", str(statement), "--trusted-key", str(vkey))
    assert checked.exit_code == 0 and "VERIFIED (aborted)" in checked.output, checked.output
    checked_json = json.loads(
        run("verify-attestation", str(statement), "--trusted-key", str(vkey), "--json").output
    )
    assert checked_json["statement"]["predicate"]["aborted"] is True
    assert checked_json["statement"]["predicate"]["g"] is None

    again = run("run", "abort", run_id, "--reason", "twice")
    assert again.exit_code == 3 and "already closed" in again.output

    gains = json.loads(run("analysis", "gains", "--json").output)
    assert [g["run_id"] for g in gains["runs"]] == [scored]
    assert gains["aborted"] == [run_id] and "1 aborted run left out" in gains["note"]
    caps = json.loads(run("analysis", "capabilities", "--json").output)
    assert caps["aborted"] == [run_id]
    assert "aborted run left out" in run("analysis", "gains").output
    excluded: list[str] = []
    aborted: list[str] = []
    assert [g.run_id for g in collect(service.ledger, excluded=excluded, aborted=aborted)] == [
        scored
    ]
    assert aborted == [run_id]
