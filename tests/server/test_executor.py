"""The executor interface: trial plans in, sandbox results out, chosen by configuration.

The local executor runs real trials (the process backend) from their plans alone; every
trial of an evaluation and of held-out scoring goes through the service's executor; an
executor that fails a trial gets it recorded as not run; one that cannot run the run's
backend fails the request before anything is recorded; ``HOLEDGER_EXECUTOR`` and
``serve --executor`` choose one by its scheme, and an unknown scheme is a one-line error
(exit 2) naming the known ones.
"""

from __future__ import annotations

import sys
import textwrap
from concurrent.futures import Future
from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.errors import SandboxError, UsageError
from holedger.ledger.store import Ledger
from holedger.protocol.answers import parse_answer
from holedger.replay.runs import replay_run
from holedger.sandboxes import Limits, SandboxResult
from holedger.schemas.canonical import canonical_json
from holedger.server import executor as executor_module
from holedger.server.executor import (
    ENV_VAR,
    LocalExecutor,
    TrialPlan,
    make_executor,
    register_executor,
)
from holedger.server.service import RunService, ServerConfig
from holedger.server.taskview import ServerTask

from .helpers import assert_replay_verifies, perfect_candidate
from .tinytask import question


class RecordingExecutor:
    """The local executor, with every plan it was handed kept (and, optionally, the
    sandboxes of some trials failing as a node that died would)."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.local = LocalExecutor()
        self.plans: list[TrialPlan] = []
        self.checked: list[str] = []
        self.fail = fail or set()

    def check(self, backend: str) -> None:
        self.checked.append(backend)
        self.local.check(backend)

    def submit(self, plan: TrialPlan) -> Future[SandboxResult]:
        self.plans.append(plan)
        if plan.trial_id in self.fail:
            future: Future[SandboxResult] = Future()
            future.set_exception(ConnectionError("the node running it went away"))
            return future
        return self.local.submit(plan)

    def describe(self) -> dict[str, str]:
        return {"executor": "recording"}

    def close(self) -> None:
        self.local.close()


def _service(home: Settings, task: ServerTask, executor: object) -> RunService:
    config = ServerConfig(
        gateway=None,
        task_loader=lambda ref: task,
        default_backend="process",
        executor=executor,  # type: ignore[arg-type]
    )
    return RunService(home, Ledger.from_settings(home), config)


def test_the_local_executor_runs_a_trial_from_its_plan_alone(
    fresh_service: RunService, tiny: ServerTask
) -> None:
    run_id = fresh_service.open_run("tiny", baseline=False).run_id
    state = fresh_service.state(run_id)
    tree = state.candidates[state.seed_commit].tree
    plan = TrialPlan(
        run_id=run_id,
        trial_id="plan-test-1",
        tree=tree,
        repository=fresh_service.settings.run_repo(run_id),
        argv=tuple(tiny.terms.entrypoint),
        stdin=canonical_json({"q": "easy one"}) + b"\n",
        model="none",
        limits=Limits(wall_s=30),
        backend="process",
    )
    executor = LocalExecutor()
    result = executor.submit(plan).result()
    executor.close()
    assert result.exit_status == 0 and result.backend == "process"
    assert parse_answer(result.stdout)[0] == {"answer": "EASY ONE"}
    assert b"thinking about easy one" in result.stderr
    unknown = TrialPlan(**{**plan.__dict__, "tree": "0" * 40})
    with pytest.raises(Exception, match="no candidate tree"):
        executor.submit(unknown).result()


def test_every_trial_of_a_run_goes_through_the_services_executor(
    fresh_home: Settings, tiny: ServerTask
) -> None:
    recording = RecordingExecutor()
    service = _service(fresh_home, tiny, recording)
    try:
        opened = service.open_run("tiny")  # its seed baseline's trials, too
        assert opened.seed_baseline is not None
        baseline_run = opened.seed_baseline.baseline_run_id
        assert {p.run_id for p in recording.plans} == {baseline_run}
        recording.plans.clear()
        run_id = opened.run_id
        better = perfect_candidate(service, run_id, tiny)
        service.evaluate(run_id, better, "dev", ["dev-1", "dev-2"], attempts=2)
        assert len(recording.plans) == 4
        tree = service.state(run_id).candidates[better].tree
        assert {p.tree for p in recording.plans} == {tree}
        assert {p.backend for p in recording.plans} == {"process"}
        assert all(p.gateway is None for p in recording.plans)  # the tiny task has no model
        inputs = sorted(p.stdin for p in recording.plans)
        expected = sorted(
            canonical_json({"q": question(c)}) + b"\n" for c in ("dev-1", "dev-2") for _ in "ab"
        )
        assert inputs == expected
        service.nominate(run_id, better)
        records = list(service.ledger.records(run_id))
        trial_ids = [r.payload["trial_id"] for r in records if r.type == "TrialCompleted"]
        assert sorted(trial_ids) == sorted(p.trial_id for p in recording.plans)
        assert len(trial_ids) == 4 + len(tiny.cases("test")) * tiny.terms.k
        assert recording.checked and set(recording.checked) == {"process"}
        assert_replay_verifies(service.ledger, run_id)
    finally:
        service.close()
        service.ledger.close()
    assert recording.plans  # the service did not close an executor it was handed


def test_a_trial_the_executor_loses_is_recorded_as_not_run(
    fresh_home: Settings, tiny: ServerTask
) -> None:
    recording = RecordingExecutor()
    service = _service(fresh_home, tiny, recording)
    try:
        run_id = service.open_run("tiny", baseline=False).run_id
        # The second trial of the request is lost, whatever the request's id.
        original = recording.submit

        def submit(plan: TrialPlan) -> Future[SandboxResult]:
            if plan.trial_id.endswith("-0001"):
                recording.fail.add(plan.trial_id)
            return original(plan)

        recording.submit = submit  # type: ignore[method-assign]
        evaluation = service.evaluate(run_id, "seed", "dev", ["dev-1", "dev-2"], attempts=1)
        records = list(service.ledger.records(run_id))
        trials = [r.payload for r in records if r.type == "TrialCompleted"]
        assert [t["trial_id"].rsplit("-", 1)[1] for t in trials] == ["0000", "0001"]
        lost = trials[1]
        assert lost["score"] == "0" and lost["exit_status"] is None
        violations = [
            r.payload
            for r in records
            if r.type == "SafetyViolation" and r.payload["category"] == "sandbox_error"
        ]
        assert [v["trial_id"] for v in violations] == [lost["trial_id"]]
        assert "the node running it went away" in violations[0]["detail"]
        assert any("could not run" in w for w in evaluation.warnings)
        service.abort(run_id, "the search ends here")  # so that the run is complete
        report = replay_run(service.ledger, run_id)
        assert report.verified and report.verdict == "verified-aborted"
    finally:
        service.close()
        service.ledger.close()


def test_an_executor_that_cannot_run_the_backend_fails_the_request_unrecorded(
    fresh_home: Settings, tiny: ServerTask
) -> None:
    class Refusing(RecordingExecutor):
        def check(self, backend: str) -> None:
            raise SandboxError(f"no node offers backend {backend}", hint="start a node")

    refusing = Refusing()
    service = _service(fresh_home, tiny, refusing)
    try:
        run_id = service.open_run("tiny", baseline=False).run_id
        count = len(list(service.ledger.records(run_id)))
        with pytest.raises(SandboxError, match="no node offers backend process"):
            service.evaluate(run_id, "seed", "dev", ["dev-1"], attempts=1)
        with pytest.raises(SandboxError, match="no node offers"):
            service.nominate(run_id, "seed")
        assert len(list(service.ledger.records(run_id))) == count
        assert refusing.plans == []
    finally:
        service.close()
        service.ledger.close()


PLUGIN = textwrap.dedent(
    """
    from holedger.server.executor import LocalExecutor

    MADE = []

    class FarExecutor(LocalExecutor):
        def __init__(self, url):
            super().__init__("local")
            self.url = url
            MADE.append(url)

        def describe(self):
            return {"executor": "far", "address": self.url}
    """
)


def test_configuration_chooses_the_executor_by_its_scheme(
    fresh_home: Settings,
    tiny: ServerTask,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert isinstance(make_executor(), LocalExecutor)
    assert isinstance(make_executor("local"), LocalExecutor)
    with pytest.raises(UsageError, match="takes no address"):
        make_executor("local://somewhere")
    # An executor registered by name from a module the server never imports otherwise.
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "far_executor.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    monkeypatch.setitem(executor_module.EXECUTORS, "far", "far_executor:FarExecutor")
    with pytest.raises(ValueError, match="bad executor registration"):
        register_executor("far", "no-colon")
    assert "far_executor" not in sys.modules
    monkeypatch.setenv(ENV_VAR, "far://head:6379")
    service = _service(fresh_home, tiny, None)
    try:
        assert type(service.executor).__name__ == "FarExecutor"
        assert service.executor.describe() == {"executor": "far", "address": "far://head:6379"}
        run_id = service.open_run("tiny", baseline=False).run_id
        evaluation = service.evaluate(run_id, "seed", "dev", ["dev-1"], attempts=1)
        [trial] = evaluation.projection["cases"]["dev-1"]["trials"]
        assert trial["score"] == "1" and evaluation.warnings == []
    finally:
        service.close()
        service.ledger.close()
    assert sys.modules["far_executor"].MADE == ["far://head:6379"]
    # An explicit choice wins over the environment.
    assert isinstance(make_executor("local"), LocalExecutor)


def test_an_unknown_executor_is_a_one_line_error_naming_the_known_ones(
    fresh_home: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    home = ["--home", str(fresh_home.home)]
    served = runner.invoke(cli, [*home, "serve", "--executor", "nope://head:1", "--port", "0"])
    assert served.exit_code == 2, served.output
    lines = served.output.strip().splitlines()
    assert "unknown executor 'nope://head:1'" in lines[0] and "local" in lines[0]
    assert len([line for line in lines if "unknown executor" in line]) == 1
    assert "Traceback" not in served.output
    monkeypatch.setenv(ENV_VAR, "nope")
    evaluated = runner.invoke(cli, [*home, "eval", "RUN", "seed", "--split", "dev"])
    assert evaluated.exit_code == 2, evaluated.output
    [line] = [x for x in evaluated.output.splitlines() if "executor" in x]
    assert "unknown executor 'nope'" in line and "known executors are local" in line
