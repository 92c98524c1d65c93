"""Whole runs through the Python API: budget gate, protocol refusals, scoring, replay."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from holedger.config import Settings
from holedger.errors import BudgetExceededError, NotFoundError, PolicyError, Unavailable
from holedger.ledger.store import Ledger
from holedger.protocol.rules import BASELINE_OPTIMIZER
from holedger.schemas.events import EvaluationRequested, RunScored
from holedger.server.core import ServerCore
from holedger.server.service import RunService, ServerConfig
from holedger.server.taskview import ServerTask

from .helpers import (
    assert_replay_verifies,
    candidate_with_main,
    evaluate_in_background,
    independent_budget_count,
    perfect_candidate,
)
from .tinytask import CASES, make_task


def _rejections(ledger: Ledger, run_id: str) -> list[EvaluationRequested]:
    out = []
    for rec in ledger.records(run_id):
        if rec.type == "EvaluationRequested" and rec.payload["decision"] == "rejected":
            out.append(EvaluationRequested.model_validate(rec.payload))
    return out


def test_full_run_scores_against_the_pinned_baseline_and_replays(
    service: RunService, tiny: ServerTask
) -> None:
    opened = service.open_run("tiny", optimizer="tester")
    run_id = opened.run_id
    baseline = opened.seed_baseline
    assert baseline is not None and baseline.k == tiny.terms.k
    # The seed gets "hard" questions (ids divisible by 3) wrong: test-0 of test-0, test-1.
    assert baseline.e_h0 == Fraction(1, 2)
    dev = service.evaluate(run_id, "seed", "dev", ["dev-0", "dev-1"], 2)
    assert dev.policy == "per_case"
    assert dev.projection["cases"]["dev-0"]["mean"] == "0"
    assert dev.projection["cases"]["dev-1"]["mean"] == "1"
    assert dev.projection["cases"]["dev-1"]["trials"][0]["answer"] == {"answer": "EASY DEV 1"}
    better = perfect_candidate(service, run_id, tiny)
    val = service.evaluate(run_id, better[:10], "val", None, 1)
    assert val.policy == "aggregate"
    assert val.projection == {"cases": 8, "trials": 8, "mean": "1"}
    scored = service.nominate(run_id, better[:8])
    assert scored.e_h_plus == 1 and scored.e_h0 == Fraction(1, 2) and scored.g == 1
    assert set(scored.per_case) == set(CASES["test"])
    assert all(len(v) == tiny.terms.k for v in scored.per_case.values())
    recorded = [
        RunScored.model_validate(r.payload)
        for r in service.ledger.records(run_id)
        if r.type == "RunScored"
    ]
    assert len(recorded) == 1 and recorded[0].e_h0 == baseline.e_h0
    assert service.state(run_id).closed
    for rid in (run_id, baseline.baseline_run_id):
        assert rid is not None
        assert_replay_verifies(service.ledger, rid)


def test_baseline_is_computed_once_per_task_and_pinned(
    fresh_service: RunService, tiny: ServerTask, fresh_home: Settings
) -> None:
    service, home = fresh_service, fresh_home
    first = service.open_run("tiny")
    second = service.open_run("tiny")
    assert first.seed_baseline == second.seed_baseline
    assert first.seed_baseline is not None
    baseline_run = first.seed_baseline.baseline_run_id
    assert baseline_run is not None
    runs = {info.run_id: info for info in service.ledger.runs()}
    assert runs[baseline_run].optimizer == BASELINE_OPTIMIZER
    assert runs[baseline_run].state == "closed"
    assert sum(1 for i in runs.values() if i.optimizer == BASELINE_OPTIMIZER) == 1
    stored = json.loads((home.home / "baselines" / f"{tiny.digest}.json").read_text())
    assert stored["baseline_run_id"] == baseline_run and stored["e_h0"] == "0.5"
    assert service.ledger.run_terms(second.run_id).seed_baseline == first.seed_baseline


def test_a_tampered_baseline_file_is_not_trusted(
    fresh_service: RunService, tiny: ServerTask, fresh_home: Settings
) -> None:
    service, home = fresh_service, fresh_home
    first = service.open_run("tiny")
    path = home.home / "baselines" / f"{tiny.digest}.json"
    data = json.loads(path.read_text())
    data["e_h0"] = "0.9"
    path.write_text(json.dumps(data))
    second = service.open_run("tiny")
    assert second.seed_baseline is not None and first.seed_baseline is not None
    assert second.seed_baseline.e_h0 == Fraction(1, 2)
    assert second.seed_baseline.baseline_run_id != first.seed_baseline.baseline_run_id


@pytest.mark.parametrize(
    ("limits", "requests", "component"),
    [
        # dev calls: 2 allowed, the third is refused.
        ({"dev_calls": 2}, [("dev", 1, 1)] * 3, "dev calls"),
        # dev case-passes 1/2: 3 of 6 cases fit, one more case does not.
        ({"dev_passes": "1/2"}, [("dev", 3, 1), ("dev", 1, 1)], "dev case_passes"),
        # attempts count: 2 cases x 2 attempts = 4/6 > 1/2.
        ({"dev_passes": "1/2"}, [("dev", 2, 2)], "dev case_passes"),
        ({"val_calls": 1}, [("val", 5, 1), ("val", 5, 1)], "val calls"),
        ({"val_passes": "1"}, [("val", 8, 1), ("val", 5, 1)], "val case_passes"),
    ],
)
def test_requests_over_any_budget_component_are_refused_and_recorded(
    fresh_home: Settings,
    tmp_path: Path,
    limits: dict[str, object],
    requests: list[tuple[str, int, int]],
    component: str,
) -> None:
    task = make_task(tmp_path / "task", **limits)  # type: ignore[arg-type]
    ledger = Ledger.from_settings(fresh_home)
    service = RunService(
        fresh_home,
        ledger,
        ServerConfig(gateway=None, task_loader=lambda r: task, default_backend="process"),
    )
    try:
        run_id = service.open_run("tiny").run_id
        for n, (split, n_cases, attempts) in enumerate(requests):
            ids = CASES[split][:n_cases]
            if n == len(requests) - 1:
                with pytest.raises(BudgetExceededError, match=component):
                    service.evaluate(run_id, "seed", split, ids, attempts)
            else:
                service.evaluate(run_id, "seed", split, ids, attempts)
        rejected = _rejections(ledger, run_id)
        assert len(rejected) == 1 and component in (rejected[0].reason or "")
        counted = independent_budget_count(ledger, run_id)
        service.nominate(run_id, "seed")
        report = assert_replay_verifies(ledger, run_id)
        table = {row["component"]: row for row in report.sections["budget_table"]}
        for split in ("dev", "val"):
            assert str(table[f"{split} calls"]["used"]) == str(counted["calls"].get(split, 0))
            used = Fraction(str(table[f"{split} case_passes"]["used"]))
            assert used == counted["passes"][split]
        assert service.state(run_id).used.dev.calls == counted["calls"].get("dev", 0)
    finally:
        service.close()
        ledger.close()


def test_protocol_refusals_are_recorded_with_their_reason(
    service: RunService, tiny: ServerTask
) -> None:
    run_id = service.open_run("tiny").run_id
    with pytest.raises(PolicyError, match="test split is closed"):
        service.evaluate(run_id, "seed", "test", ["test-1"], 2)
    with pytest.raises(PolicyError, match="at least 5 cases"):
        service.evaluate(run_id, "seed", "val", ["val-1", "val-2"], 1)
    with pytest.raises(PolicyError, match="more than once"):
        service.evaluate(run_id, "seed", "dev", ["dev-1", "dev-1"], 1)
    reasons = [r.reason for r in _rejections(service.ledger, run_id)]
    assert len(reasons) == 3
    # No test-split trial ran.
    assert not any(
        r.type == "TrialCompleted" and r.payload["split"] == "test"
        for r in service.ledger.records(run_id)
    )
    # An unknown candidate or case is a malformed request, recorded nowhere.
    with pytest.raises(NotFoundError):
        service.evaluate(run_id, "deadbeef", "dev", ["dev-1"], 1)
    with pytest.raises(NotFoundError, match="not in the dev split"):
        service.evaluate(run_id, "seed", "dev", ["val-1"], 1)
    assert len(_rejections(service.ledger, run_id)) == 3
    assert_replay_verifies(service.ledger, service.nominate(run_id, "seed").run_id)


def test_nominate_twice_and_search_after_nomination_are_refused(
    service: RunService, tiny: ServerTask
) -> None:
    run_id = service.open_run("tiny").run_id
    service.nominate(run_id, "seed")
    events = sum(1 for _ in service.ledger.records(run_id))
    with pytest.raises(PolicyError, match="already has a nomination"):
        service.nominate(run_id, "seed")
    with pytest.raises(PolicyError):
        service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
    with pytest.raises(PolicyError):
        service.evaluate(run_id, "seed", "test", None, 2)
    assert sum(1 for _ in service.ledger.records(run_id)) == events
    assert_replay_verifies(service.ledger, run_id)


def test_disclosed_blobs_are_only_those_in_projections(
    service: RunService, tiny: ServerTask
) -> None:
    run_id = service.open_run("tiny").run_id
    dev = service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
    trial = dev.projection["cases"]["dev-1"]["trials"][0]
    assert b"thinking about" in service.disclosed_blob(run_id, trial["trace_digest"])
    assert json.loads(service.disclosed_blob(run_id, trial["answer_digest"])) == {
        "answer": "EASY DEV 1"
    }
    val_trials = [
        r.payload
        for r in service.ledger.records(run_id)
        if r.type == "TrialCompleted" and r.payload["split"] == "dev"
    ]
    assert val_trials
    service.evaluate(run_id, "seed", "val", CASES["val"][:5], 1)
    hidden = [
        r.payload["trace_digest"]
        for r in service.ledger.records(run_id)
        if r.type == "TrialCompleted" and r.payload["split"] == "val"
    ]
    for digest in hidden:
        assert service.ledger.has_blob(digest)
        with pytest.raises(NotFoundError):
            service.disclosed_blob(run_id, digest)


def test_every_run_in_the_shared_home_replays_once_closed(service: RunService) -> None:
    """Runs left open by other tests are nominated (closing them); then all verify."""
    runs = service.ledger.run_ids()
    assert runs
    for run_id in runs:
        state = service.state(run_id)
        if not state.closed:
            service.nominate(run_id, "seed")
    for run_id in runs:
        assert_replay_verifies(service.ledger, run_id)


def test_a_nomination_cut_short_during_held_out_scoring_is_finished_by_nominating_again(
    service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server stops while the held-out trials run: the nomination and the held-out
    # request are recorded, the trials and RunScored (one append) are not.
    run_id = service.open_run("tiny").run_id
    other = perfect_candidate(service, run_id, tiny)
    run_trials = ServerCore.run_trials

    def stopped(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(ServerCore, "run_trials", stopped)
    with pytest.raises(KeyboardInterrupt):
        service.nominate(run_id, "seed")
    monkeypatch.setattr(ServerCore, "run_trials", run_trials)
    with pytest.raises(PolicyError, match="already has a nomination"):
        service.nominate(run_id, other)
    scored = service.nominate(run_id, "seed")
    assert scored.candidate == tiny.terms.seed_commit
    types = [r.type for r in service.ledger.records(run_id)]
    assert types.count("CandidateNominated") == 1 and types.count("RunScored") == 1
    heldout = [
        r
        for r in service.ledger.records(run_id)
        if r.type == "EvaluationRequested" and r.payload["split"] == "test"
    ]
    assert len(heldout) == 1  # reused, not asked again
    assert types[-2:] == ["RunClosed", "Checkpoint"]
    assert_replay_verifies(service.ledger, run_id)


def test_a_run_scored_but_not_closed_is_closed_by_nominating_again(
    service: RunService, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = service.open_run("tiny").run_id
    close_run = service.ledger.close_run

    def stopped(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(service.ledger, "close_run", stopped)
    with pytest.raises(KeyboardInterrupt):
        service.nominate(run_id, "seed")
    monkeypatch.setattr(service.ledger, "close_run", close_run)
    first = [r.type for r in service.ledger.records(run_id)]
    assert "RunScored" in first and "RunClosed" not in first
    scored = service.nominate(run_id, "seed")
    types = [r.type for r in service.ledger.records(run_id)]
    assert types.count("RunScored") == 1 and types.count("TrialCompleted") == first.count(
        "TrialCompleted"
    )
    assert scored.e_h0 is not None and "RunClosed" in types
    assert_replay_verifies(service.ledger, run_id)


def test_a_run_opened_without_a_backend_keeps_the_one_chosen_then(
    fresh_home: Settings, tiny: ServerTask
) -> None:
    from holedger.errors import SandboxError
    from holedger.sandboxes import get_backend
    from holedger.server.service import RunConfig

    try:
        strongest = get_backend(None).name
    except SandboxError as exc:
        pytest.skip(f"no isolating backend on this machine: {exc.message}")
    service = RunService(
        fresh_home, Ledger.from_settings(fresh_home), ServerConfig(task_loader=lambda r: tiny)
    )
    try:
        opened = service.open_run("tiny", baseline=False)
        assert opened.backend == strongest
        assert RunConfig.load(fresh_home, opened.run_id).backend == strongest
    finally:
        service.close()
        service.ledger.close()


def test_nominations_that_race_score_the_run_once(
    fresh_service: RunService, tiny: ServerTask
) -> None:
    """A client retrying a slow nomination: the second call waits for the first, then is
    refused; the held-out trials run once and the run verifies."""
    import threading

    service = fresh_service
    run_id = service.open_run("tiny").run_id
    results: list[object] = []
    start = threading.Barrier(3)

    def nominate() -> None:
        start.wait()
        try:
            results.append(service.nominate(run_id, "seed"))
        except PolicyError as exc:
            results.append(exc)

    threads = [threading.Thread(target=nominate) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    scored = [r for r in results if not isinstance(r, PolicyError)]
    refused = [r for r in results if isinstance(r, PolicyError)]
    assert len(scored) == 1 and len(refused) == 2, results
    assert all("already has a nomination" in e.message for e in refused)
    types = [r.type for r in service.ledger.records(run_id)]
    assert types.count("RunScored") == 1 and types.count("RunClosed") == 1
    assert types.count("TrialCompleted") == len(CASES["test"]) * tiny.terms.k
    assert_replay_verifies(service.ledger, run_id)


def test_draining_waits_for_evaluations_in_flight_and_refuses_new_ones(
    fresh_service: RunService, tiny: ServerTask
) -> None:
    """What `holedger serve` does on its first signal: the evaluation in flight is
    recorded whole before the gateway and the ledger close; a new one is refused."""
    import time

    service = fresh_service
    run_id = service.open_run("tiny", baseline=False).run_id
    slow = candidate_with_main(service, run_id, tiny, slow_main(1))
    worker, done = evaluate_in_background(service, run_id, slow, ["dev-1"])
    deadline = time.monotonic() + 30
    while service.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.in_flight == 1
    assert service.drain(timeout=60) == 0
    worker.join(timeout=5)
    assert len(done) == 1  # it finished, and was recorded whole
    types = [r.type for r in service.ledger.records(run_id)]
    assert types[-1] == "DisclosureProjected" and "TrialCompleted" in types
    with pytest.raises(Unavailable, match="stopping"):
        service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
    with pytest.raises(Unavailable):
        service.nominate(run_id, "seed")
    assert [r.type for r in service.ledger.records(run_id)] == types  # nothing recorded


def test_an_interrupted_evaluation_is_recorded_whole_with_the_trials_not_run(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during `holedger eval`: the trials running end and are recorded, those not
    started are recorded as not run (score 0, sandbox_error), then the projection; the
    run stays consistent instead of keeping an accepted request without trials."""
    import os
    import signal
    import threading
    import time

    service = fresh_service
    run_id = service.open_run("tiny", baseline=False).run_id
    slow = candidate_with_main(service, run_id, tiny, slow_main(1.5))
    cases = CASES["dev"][:4]  # two workers: two run, two wait
    from holedger.server import dispatch

    started = threading.Event()
    run_one = dispatch.run_one

    def spy(*args: Any) -> Any:
        started.set()
        return run_one(*args)

    monkeypatch.setattr(dispatch, "run_one", spy)

    def interrupt() -> None:  # as Ctrl-C does, once the first trials run
        if started.wait(30):
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            service.evaluate(run_id, slow, "dev", cases, 1)
    finally:
        interrupter.join()
    records = list(service.ledger.records(run_id))
    assert records[-1].type == "DisclosureProjected"
    trials = [r.payload for r in records if r.type == "TrialCompleted"]
    assert sorted(t["case_id"] for t in trials) == sorted(cases)
    not_run = [
        r.payload
        for r in records
        if r.type == "SafetyViolation" and "interrupted" in r.payload["detail"]
    ]
    assert len(not_run) == 2, [(t["case_id"], t["exit_status"], t["wall_ms"]) for t in trials]
    ran = [t for t in trials if t["exit_status"] == 0]
    assert len(ran) == 2  # the two running when the interrupt came ended normally
    service.ledger.close_run(run_id, reason="aborted")
    assert_replay_verifies(service.ledger, run_id)


def slow_main(seconds: float) -> str:
    """A harness that answers after ``seconds``."""
    return f"import json, time\ntime.sleep({seconds})\nprint(json.dumps({{'answer': 'X'}}))\n"
