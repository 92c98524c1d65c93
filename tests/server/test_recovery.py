"""A server that stops while trials run: the request it accepted is recorded afterwards.

An evaluation holds a lock file for its request from before the request is recorded until
its projection is. A request without a projection whose lock is free was left by a server
that was killed; `holedger run recover`, and every later eval and nominate of the run,
records its trials as not run (with the model calls they made) and its projection, so the
run verifies again. A request still being evaluated by a live process is left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from holedger.config import Settings
from holedger.errors import PolicyError, Unavailable
from holedger.gateway.tokens import tokens_table
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from holedger.schemas.events import TrialCompleted
from holedger.server.core import ServerCore
from holedger.server.recovery import record_left
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .conftest import _service
from .helpers import (
    assert_replay_verifies,
    candidate_with_main,
    cli_invoker,
    evaluate_in_background,
)
from .test_runs import slow_main
from .tinytask import CASES, model_task, write_seed, write_task_folder

REPO = Path(__file__).resolve().parents[2]
LEFT = "not recorded: the evaluation of its request ended before recording it"


def _replay_failures(ledger: Ledger, run_id: str) -> str:
    report = replay_run(ledger, run_id)
    assert not report.verified
    return " | ".join(f"{c.name}: {c.detail}" for c in report.checks if not c.ok)


def _verifies_but_open(ledger: Ledger, run_id: str) -> None:
    """Replay finds nothing wrong but that the run is still open."""
    report = replay_run(ledger, run_id)
    failed = {c.name: c.detail for c in report.checks if not c.ok and c.level == "error"}
    assert list(failed) == ["closed"], failed


def _wait_for(predicate: Any, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _left_behind(ledger: Ledger, run_id: str) -> list[str]:
    """The ids of accepted requests without a projection."""
    accepted, projected = [], set()
    for rec in ledger.records(run_id):
        if rec.type == "EvaluationRequested" and rec.payload["decision"] == "accepted":
            accepted.append(rec.payload["request_id"])
        elif rec.type == "DisclosureProjected":
            projected.add(rec.payload["request_id"])
    return [r for r in accepted if r not in projected]


def _interrupt_before_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next evaluation stop between recording its request and running its
    trials, as a Ctrl-C landing there (or a server killed there) would."""

    def stop(*_: Any, **__: Any) -> Any:
        monkeypatch.undo()
        raise KeyboardInterrupt

    monkeypatch.setattr(ServerCore, "run_trials", stop)


def test_an_eval_killed_outright_is_recorded_by_run_recover(
    fresh_home: Settings, tmp_path: Path
) -> None:
    """`holedger eval` killed with SIGKILL while its trials run: replay fails on the
    request; `holedger run recover` records it; replay then verifies."""
    task_dir = write_task_folder(tmp_path / "task")
    home = ["--home", str(fresh_home.home)]
    run = cli_invoker(fresh_home)
    opened = json.loads(
        run("run", "open", "--task", str(task_dir), "--backend", "process", "--json")
    )
    run_id = opened["run_id"]
    folder = write_seed(tmp_path / "slow")
    (folder / "harness" / "__main__.py").write_text(slow_main(20))
    slow = json.loads(run("candidate", "commit", run_id, str(folder), "--json"))["candidate"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "holedger.cli", *home, "eval", run_id, slow, "--split", "dev"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ledger = Ledger.from_settings(fresh_home)
    try:
        _wait_for(lambda: _left_behind(ledger, run_id), "the request to be recorded")
        time.sleep(0.5)  # its trials have started
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        [left] = _left_behind(ledger, run_id)
        assert "trials never recorded" in _replay_failures(ledger, run_id)
        shown = run("run", "show", run_id)
        assert f"1 accepted request without trials or projection yet: {left}" in shown
        assert f"'holedger run recover {run_id}'" in shown

        out = run("run", "recover", run_id)
        assert f"recorded request {left}" in out
        assert _left_behind(ledger, run_id) == []
        records = list(ledger.records(run_id))
        trials = [
            TrialCompleted.model_validate(r.payload)
            for r in records
            if r.type == "TrialCompleted" and r.payload["request_id"] == left
        ]
        assert sorted(t.case_id for t in trials) == sorted(CASES["dev"])
        assert all(t.score == 0 and t.exit_status is None for t in trials)
        violations = [r.payload for r in records if r.type == "SafetyViolation"]
        assert sum(LEFT in v["detail"] for v in violations) == len(CASES["dev"])
        projection = next(
            r.payload
            for r in records
            if r.type == "DisclosureProjected" and r.payload["request_id"] == left
        )
        assert all(e["mean"] == "0" for e in projection["projection"]["cases"].values())
        _verifies_but_open(ledger, run_id)
        assert json.loads(run("run", "show", run_id, "--json"))["unprojected_requests"] == []
        assert "without trials" not in run("run", "show", run_id)

        again = json.loads(run("run", "recover", run_id, "--json"))
        assert again == {
            "run_id": run_id,
            "recorded": [],
            "running": [],
            "unscored_nomination": None,
        }
        assert "nothing left unrecorded" in run("run", "recover", run_id)
        # The run goes on: the next evaluation and the nomination work as usual.
        run("eval", run_id, "seed", "--split", "dev", "--cases", "dev-1")
        run("nominate", run_id, "seed")
        assert "VERIFIED" in run("replay", run_id)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        ledger.close()


@pytest.mark.slow
def test_a_killed_trial_keeps_the_model_calls_it_made(fresh_home: Settings, tmp_path: Path) -> None:
    """The trials of a killed evaluation had called the model through the gateway: the
    recovered trials report exactly the tokens of their recorded calls (replay's
    gateway_trial_totals holds), and their tokens are revoked."""
    task = model_task(tmp_path / "task", wait_s=30)
    service = _service(fresh_home, task)
    worker: subprocess.Popen[bytes] | None = None
    try:
        run_id = service.open_run("model", baseline=False).run_id
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.server.model_worker",
                str(fresh_home.home),
                str(tmp_path / "task"),
                run_id,
                "30",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def calls() -> list[dict[str, Any]]:
            return [r.payload for r in service.ledger.records(run_id) if r.type == "GatewayCall"]

        _wait_for(lambda: len({c["trial_id"] for c in calls()}) == 2, "both trials' model calls")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        assert "trials never recorded" in _replay_failures(service.ledger, run_id)

        found = service.recover(run_id)
        [left] = found.recorded
        made = calls()
        trials = [
            TrialCompleted.model_validate(r.payload)
            for r in service.ledger.records(run_id)
            if r.type == "TrialCompleted"
        ]
        assert len(trials) == 2
        for trial in trials:
            mine = [c for c in made if c["trial_id"] == trial.trial_id]
            assert trial.gateway_calls == len(mine) >= 1
            assert trial.tokens.total == sum(c["tokens"]["total"] for c in mine) > 0
            assert trial.tokens.input == sum(c["tokens"]["input"] for c in mine)
        _verifies_but_open(service.ledger, run_id)
        report = replay_run(service.ledger, run_id)
        assert any(c.name == "gateway_trial_totals" and c.ok for c in report.checks)
        with service.ledger.app.engine.connect() as conn:
            rows = conn.execute(
                tokens_table.select().where(tokens_table.c.request_id == left)
            ).fetchall()
        assert len(rows) == 2 and all(row.revoked for row in rows)
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        service.close()
        service.ledger.close()


def test_a_request_still_being_evaluated_is_left_alone(
    fresh_service: RunService, fresh_home: Settings, tiny: ServerTask
) -> None:
    """Another process (here: a second service, with its own state) recovering or
    evaluating the run while an evaluation runs does not touch that evaluation's request."""
    service = fresh_service
    run_id = service.open_run("tiny", baseline=False).run_id
    slow = candidate_with_main(service, run_id, tiny, slow_main(2))
    worker, done = evaluate_in_background(service, run_id, slow, ["dev-1"])
    other = _service(fresh_home, tiny)
    try:
        _wait_for(lambda: _left_behind(other.ledger, run_id), "the request to be recorded")
        [running] = _left_behind(other.ledger, run_id)
        found = other.recover(run_id)
        assert found.recorded == [] and found.running == [running]
        other.evaluate(run_id, "seed", "dev", ["dev-2"], 1)  # recovers first: nothing
        worker.join(timeout=60)
        assert len(done) == 1
        assert done[0].projection["cases"]["dev-1"]["mean"] == "0"  # slow_main answers X
        details = [
            r.payload["detail"] for r in other.ledger.records(run_id) if r.type == "SafetyViolation"
        ]
        assert not any(LEFT in d for d in details)
        exits = [
            r.payload["exit_status"]
            for r in other.ledger.records(run_id)
            if r.type == "TrialCompleted"
        ]
        assert exits == [0, 0]
        assert other.recover(run_id).running == []
        _verifies_but_open(other.ledger, run_id)
    finally:
        worker.join(timeout=60)
        other.close()
        other.ledger.close()


def test_the_next_evaluation_records_a_request_left_before_its_trials(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop between recording a request and starting its trials (a Ctrl-C landing
    there) left the request bare; the next evaluation of the run records it first."""
    service = fresh_service
    run_id = service.open_run("tiny", baseline=False).run_id
    _interrupt_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.evaluate(run_id, "seed", "dev", ["dev-1", "dev-2"], 2)
    [left] = _left_behind(service.ledger, run_id)
    assert "4 of 4 trials never recorded" in _replay_failures(service.ledger, run_id)

    ev = service.evaluate(run_id, "seed", "val", None, 1)
    assert ev.request_id != left
    assert _left_behind(service.ledger, run_id) == []
    records = list(service.ledger.records(run_id))
    types = [r.type for r in records]
    left_projection = next(
        i
        for i, r in enumerate(records)
        if r.type == "DisclosureProjected" and r.payload["request_id"] == left
    )
    new_request = next(
        i
        for i, r in enumerate(records)
        if r.type == "EvaluationRequested" and r.payload["request_id"] == ev.request_id
    )
    assert left_projection < new_request  # recorded before the new request was decided
    trials = [r.payload for r in records if r.type == "TrialCompleted"]
    left_trials = [t for t in trials if t["request_id"] == left]
    assert [(t["case_id"], t["attempt"]) for t in left_trials] == [
        ("dev-1", 0),
        ("dev-1", 1),
        ("dev-2", 0),
        ("dev-2", 1),
    ]
    assert [t["trial_id"] for t in left_trials] == [f"{left}-{i:04d}" for i in range(4)]
    assert types.count("DisclosureProjected") == 2
    _verifies_but_open(service.ledger, run_id)
    # The trials recorded as not run ran nothing, so none of them ran unisolated.
    report = replay_run(service.ledger, run_id)
    [isolation] = [c for c in report.checks if c.name == "isolation"]
    assert isolation.detail == (
        f"{len(CASES['val'])} of {len(CASES['val'])} trials that ran did so without "
        "isolation (process backend); 4 trials recorded as not run"
    )
    safety = report.sections["safety"]
    assert safety["unisolated_trials"] == len(CASES["val"]) and safety["not_run_trials"] == 4


def test_nominating_records_a_request_left_behind_first(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nomination closes the run, after which nothing may be added: it records a request
    left behind before it nominates, so the closed run verifies."""
    service = fresh_service
    run_id = service.open_run("tiny").run_id
    _interrupt_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
    [left] = _left_behind(service.ledger, run_id)
    service.nominate(run_id, "seed")
    records = list(service.ledger.records(run_id))
    projected = next(
        i
        for i, r in enumerate(records)
        if r.type == "DisclosureProjected" and r.payload["request_id"] == left
    )
    nominated = next(i for i, r in enumerate(records) if r.type == "CandidateNominated")
    assert projected < nominated
    assert_replay_verifies(service.ledger, run_id)


def test_a_closed_run_with_a_request_left_behind_is_refused_whole(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing may follow RunClosed: recovering such a run is refused with nothing
    recorded, and replay goes on reporting the request."""
    service = fresh_service
    run_id = service.open_run("tiny", baseline=False).run_id
    _interrupt_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
    service.ledger.close_run(run_id, reason="aborted")
    before = [r.seq for r in service.ledger.records(run_id)]
    with pytest.raises(PolicyError, match="closed with 1 request never recorded"):
        service.recover(run_id)
    assert [r.seq for r in service.ledger.records(run_id)] == before
    assert "trials never recorded" in _replay_failures(service.ledger, run_id)


def test_a_seed_baseline_cut_short_is_finished_by_the_next_run_open(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt during the first `run open`'s baseline scoring: the next `run open`
    finishes that baseline run instead of leaving it behind and starting another."""
    service = fresh_service
    _interrupt_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.open_run("tiny")
    [baseline_run] = service.ledger.run_ids()  # the baseline run, nominated, unscored
    assert service.state(baseline_run).nominated is not None
    assert service.state(baseline_run).scored is None

    opened = service.open_run("tiny")
    assert opened.seed_baseline is not None
    assert opened.seed_baseline.baseline_run_id == baseline_run
    assert sorted(service.ledger.run_ids()) == sorted([baseline_run, opened.run_id])
    assert service.state(baseline_run).closed
    assert_replay_verifies(service.ledger, baseline_run)
    assert not service.baseline_path(tiny).with_suffix(".pending").exists()
    # Pinned for good: a third run reuses it without scoring anything.
    third = service.open_run("tiny")
    assert third.seed_baseline == opened.seed_baseline
    assert len(service.ledger.run_ids()) == 3


def test_a_request_is_never_recorded_twice(
    fresh_service: RunService,
    fresh_home: Settings,
    tiny: ServerTask,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two recoverers that both got past the lock (or an evaluation and a recoverer) append
    the request's trials as a decision: the second finds it recorded and appends nothing."""
    service = fresh_service
    run_id = service.open_run("tiny", baseline=False).run_id
    _interrupt_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
    request = next(iter(service.state(run_id).pending.values()))
    other = _service(fresh_home, tiny)
    try:
        assert record_left(service.core, run_id, request) is True
        before = list(service.ledger.records(run_id))
        assert record_left(other.core, run_id, request) is False
        # Even with its events built before the first appended them, the second appends
        # nothing: the append is decided on the run as it is then.
        again = [
            (r.type, r.payload, "server")
            for r in before
            if r.type in ("TrialCompleted", "SafetyViolation", "DisclosureProjected")
        ]
        assert len(again) == 3
        assert other.core.record_request(run_id, request.request_id, again) is False
        assert [r.seq for r in service.ledger.records(run_id)] == [r.seq for r in before]
    finally:
        other.close()
        other.ledger.close()
    _verifies_but_open(service.ledger, run_id)


def test_a_lock_file_removed_by_its_holder_is_not_held_twice(tmp_path: Path) -> None:
    """The holder of a request's lock removes the file before letting go. One who opened
    the old file and locks it afterwards must not count as holding the lock, or a third
    could lock the new file at the same path and both would hold it."""
    from holedger.server.locks import request_lock as _request_lock

    path = tmp_path / "runs" / "r.requests" / "req.lock"
    held: list[bool] = []
    release = threading.Event()
    opened = threading.Event()

    def waiter() -> None:
        with _request_lock(path) as ok:  # waits for the holder, then holds the lock
            held.append(ok)
            opened.set()
            release.wait(30)

    with _request_lock(path) as first:
        assert first
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.5)  # the waiter has opened the file and waits in flock
    assert opened.wait(30) and held == [True]
    with _request_lock(path, wait=False) as third:
        assert third is False  # the waiter holds the file now at the path
    release.set()
    thread.join(30)
    with _request_lock(path, wait=False) as fourth:
        assert fourth is True


def test_a_nomination_is_refused_while_an_evaluation_runs(
    fresh_service: RunService, tiny: ServerTask
) -> None:
    """A nomination would close the run under an evaluation still running (whose trials
    would then follow RunClosed): it is refused until that evaluation is recorded."""
    service = fresh_service
    run_id = service.open_run("tiny").run_id
    slow = candidate_with_main(service, run_id, tiny, slow_main(2))
    worker, done = evaluate_in_background(service, run_id, slow, ["dev-1"])
    try:
        _wait_for(lambda: _left_behind(service.ledger, run_id), "the request to be recorded")
        before = [r.seq for r in service.ledger.records(run_id)]
        with pytest.raises(Unavailable, match="1 evaluation still running"):
            service.nominate(run_id, "seed")
        assert service.state(run_id).nominated is None
        assert [r.seq for r in service.ledger.records(run_id)][: len(before)] == before
    finally:
        worker.join(timeout=60)
    assert len(done) == 1
    service.nominate(run_id, "seed")
    assert_replay_verifies(service.ledger, run_id)


def test_a_baseline_run_whose_backend_is_gone_is_not_resumed(
    fresh_service: RunService, tiny: ServerTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline run cut short whose backend can no longer be used is left behind, and
    the next `run open` starts another rather than failing on it for good."""
    from holedger.errors import SandboxError
    from holedger.server import baseline as baseline_module
    from holedger.server.service import RunConfig

    service = fresh_service
    _interrupt_before_trials(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        service.open_run("tiny")
    [stuck] = service.ledger.run_ids()
    RunConfig("tiny", "docker").save(service.settings, stuck)  # as if it had used docker
    real = baseline_module.get_backend

    def no_docker(name: str | None = None) -> Any:
        if name == "docker":
            raise SandboxError("sandbox backend 'docker' is unavailable")
        return real(name)

    monkeypatch.setattr(baseline_module, "get_backend", no_docker)
    opened = service.open_run("tiny")
    assert opened.seed_baseline is not None
    assert opened.seed_baseline.baseline_run_id not in (stuck, opened.run_id)
    assert len(service.ledger.run_ids()) == 3
    assert service.state(stuck).scored is None  # left as it was
    assert_replay_verifies(service.ledger, opened.seed_baseline.baseline_run_id)
