"""Solve-evolve runs through the Python API: steps in turn, refusals, NONE run, J."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from holedger.config import Settings
from holedger.errors import UsageError
from holedger.ledger.store import Ledger
from holedger.protocol import refusals
from holedger.schemas.events import StepClosed
from holedger.server.evolve import EvolveRuns, StepRefused
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .helpers import assert_replay_verifies
from .tinytask import PERFECT_MAIN


def _refused(code: str, call: object, *args: object) -> None:
    with pytest.raises(StepRefused) as caught:
        call(*args)  # type: ignore[operator]
    assert caught.value.code == code


def test_a_solve_evolve_run_scores_each_batch_under_the_harness_before_it(
    service: RunService, tiny: ServerTask
) -> None:
    runs = EvolveRuns(service)
    terms = runs.terms_for("tiny", batch=2, steps=3, scope=None, step_tokens=None, stream=None)
    assert terms.scope == ["harness/"]  # rules/ is immutable, so not editable by default
    assert terms.stream == [f"dev-{i}" for i in range(6)]
    opened = runs.open_run("tiny", terms, optimizer="evolver")
    run_id = opened.run_id
    pinned = service.ledger.run_terms(run_id).solve_evolve
    assert pinned is not None and pinned.none_run is not None
    # NONE: the seed fails the "hard" cases dev-0 and dev-3: Base = 4/6
    assert pinned.none_run.j == Fraction(2, 3)

    first = runs.solve(run_id)
    assert first.step == 1 and first.case_ids == ["dev-0", "dev-1"]
    assert first.candidate == opened.seed_commit
    assert {c: v["mean"] for c, v in first.projection["cases"].items()} == {
        "dev-0": "0",
        "dev-1": "1",
    }
    _refused(refusals.EVOLVE_OUT_OF_TURN, runs.solve, run_id)  # the evolver's turn first
    _refused(refusals.EVOLVE_OUT_OF_TURN, runs.unchanged, run_id, 2)
    _refused(
        refusals.EVOLVE_OUT_OF_SCOPE,
        runs.commit_changes,
        run_id,
        1,
        {"notes/idea.txt": "upper-case everything"},
        None,
    )
    closed = runs.commit_changes(run_id, 1, {"harness/__main__.py": PERFECT_MAIN}, None)
    assert closed.outcome == "committed" and closed.parent == opened.seed_commit
    assert closed.changed_paths == ["harness/__main__.py"]

    second = runs.solve(run_id)
    assert second.candidate == closed.candidate  # step 2 scored by H_1
    _refused(
        refusals.EVOLVE_WRONG_PARENT,
        runs.commit_changes,
        run_id,
        2,
        {"harness/note.txt": "x"},
        "seed",
    )
    runs.unchanged(run_id, 2)
    runs.solve(run_id)
    last = runs.unchanged(run_id, 3)
    assert last.finished is not None
    # dev-0 under the seed fails; dev-1..5 pass: J = 5/6, delta = 5/6 - 2/3 = 1/6
    assert (last.finished.j, last.finished.base, last.finished.delta) == (
        Fraction(5, 6),
        Fraction(2, 3),
        Fraction(1, 6),
    )
    assert service.state(run_id).closed
    _refused(refusals.EVOLVE_DONE, runs.solve, run_id)
    steps = [
        StepClosed.model_validate(r.payload)
        for r in service.ledger.records(run_id)
        if r.type == "StepClosed"
    ]
    assert [(s.step, s.outcome) for s in steps] == [
        (1, "committed"),
        (2, "unchanged"),
        (3, "unchanged"),
    ]
    report = assert_replay_verifies(service.ledger, run_id)
    assert report.verified
    assert_replay_verifies(service.ledger, pinned.none_run.run_id)
    # the same stream again reuses the pinned NONE run
    again = runs.open_run("tiny", terms, optimizer="evolver")
    repinned = service.ledger.run_terms(again.run_id).solve_evolve
    assert repinned is not None and repinned.none_run == pinned.none_run
    service.abort(again.run_id, "opened only to see its pin")  # the shared home's runs close
    assert_replay_verifies(service.ledger, again.run_id)


@pytest.mark.parametrize(
    ("batch", "steps", "scope", "stream", "words"),
    [
        (7, 1, None, None, "larger than the stream of 6"),
        (2, 0, None, None, "--steps must be at least 1"),
        (2, 2, ["tools/"], None, "names no folder of the seed"),
        (1, 2, None, ["dev-1", "dev-1"], "repeats case 'dev-1'"),
        (1, 1, None, ["test-0"], "not a dev case"),
    ],
)
def test_bad_terms_are_refused_before_anything_is_recorded(
    service: RunService,
    batch: int,
    steps: int,
    scope: list[str] | None,
    stream: list[str] | None,
    words: str,
) -> None:
    runs = EvolveRuns(service)
    before = set(service.ledger.run_ids())
    with pytest.raises(UsageError, match=words):
        runs.terms_for(
            "tiny", batch=batch, steps=steps, scope=scope, step_tokens=None, stream=stream
        )
    assert set(service.ledger.run_ids()) == before


def test_an_evolver_works_through_its_steps_over_http(
    service: RunService, tiny: ServerTask, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import httpx

    from holedger.gateway.serve import AppServer
    from holedger.server.api import create_api_app

    runs = EvolveRuns(service)
    terms = runs.terms_for("tiny", batch=3, steps=2, scope=None, step_tokens=None, stream=None)
    opened = runs.open_run("tiny", terms, optimizer="http-evolver")
    run = opened.run_id
    sock = tmp_path_factory.mktemp("evolve-api") / "api.sock"
    server = AppServer(create_api_app(service), host="127.0.0.1", port=0, uds=sock)
    server.start()
    headers = {"authorization": f"Bearer {opened.optimizer_token}"}
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{server.port}", headers=headers, timeout=120
        ) as http:
            info = http.get(f"/v1/runs/{run}").json()
            assert info["protocol"] == "solve-evolve" and info["scored_cases"] == []
            assert "dev" not in info and "hard" not in str(info)  # no case before its batch
            refused = http.post(
                f"/v1/runs/{run}/evaluations", json={"candidate": "seed", "split": "dev"}
            )
            assert refused.status_code == 409
            assert refused.json()["error"]["code"] == refusals.EVOLVE_NOT_SOLVE_EVOLVE
            evidence = http.post(f"/v1/runs/{run}/steps")
            assert evidence.status_code == 200, evidence.text
            body = evidence.json()
            assert body["step"] == 1 and body["case_ids"] == ["dev-0", "dev-1", "dev-2"]
            trial = body["projection"]["cases"]["dev-0"]["trials"][0]
            trace = http.get(f"/v1/runs/{run}/blobs/{trial['trace_digest']}")
            assert trace.status_code == 200 and b"thinking about hard dev 0" in trace.content
            again = http.post(f"/v1/runs/{run}/steps")
            assert again.status_code == 409
            assert again.json()["error"]["code"] == refusals.EVOLVE_OUT_OF_TURN
            made = http.post(
                f"/v1/runs/{run}/steps/1/commit",
                json={"changes": {"harness/__main__.py": PERFECT_MAIN}},
            )
            assert made.status_code == 201, made.text
            assert made.json()["changed_paths"] == ["harness/__main__.py"]
            assert http.get(f"/v1/runs/{run}/steps").json()["scored_cases"] == [
                "dev-0",
                "dev-1",
                "dev-2",
            ]
            second = http.post(f"/v1/runs/{run}/steps").json()
            assert second["candidate"] == made.json()["candidate"]
            done = http.post(f"/v1/runs/{run}/steps/2/unchanged").json()
            assert done["state"] == "closed"
            # dev-0 failed under the seed; the other five pass: J = 5/6, Base 2/3
            assert done["in_situ"] == {"j": "5/6", "base": "2/3", "delta": "1/6"}
    finally:
        server.stop()
    assert_replay_verifies(service.ledger, run)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--batch", "7"], "--batch 7 is larger than the stream of 6 cases"),
        (["--batch", "2", "--steps", "0"], "--steps must be at least 1"),
        (["--batch", "2", "--scope", "tools"], "scope 'tools' names no folder of the seed"),
        (["--batch", "1", "--stream", "REPEATS"], "the stream repeats case 'dev-2'"),
        (["--steps", "2"], "--batch is required"),
    ],
)
def test_bad_input_at_run_open_is_one_line_and_exit_2(
    fresh_home: Settings, tmp_path: Path, args: list[str], words: str
) -> None:
    from click.testing import CliRunner

    from holedger.cli import cli

    from .tinytask import write_task_folder

    task_dir = write_task_folder(tmp_path / "task")
    stream = tmp_path / "stream.txt"
    stream.write_text("dev-1\ndev-2\ndev-2\n")
    args = [str(stream) if a == "REPEATS" else a for a in args]
    home = ["--home", str(fresh_home.home)]
    opened = CliRunner().invoke(
        cli, [*home, "run", "open", "--task", str(task_dir), "--protocol", "solve-evolve", *args]
    )
    assert opened.exit_code == 2, opened.output
    first = opened.output.strip().splitlines()[0]
    assert words in first, opened.output
    assert "Traceback" not in opened.output
    assert Ledger.from_settings(fresh_home).run_ids() == []  # nothing half-written


def test_a_solve_evolve_run_takes_no_search_commit_or_evaluation(
    service: RunService, tiny: ServerTask
) -> None:
    from holedger.errors import PolicyError

    from .helpers import perfect_candidate

    runs = EvolveRuns(service)
    terms = runs.terms_for("tiny", batch=6, steps=1, scope=None, step_tokens=None, stream=None)
    run_id = runs.open_run("tiny", terms, optimizer="evolver").run_id
    with pytest.raises(PolicyError, match="solve-evolve run"):
        service.evaluate(run_id, "seed", "dev", ["dev-0"], 1)
    with pytest.raises(PolicyError, match="solve-evolve run"):
        perfect_candidate(service, run_id, tiny)
    runs.solve(run_id)
    assert runs.unchanged(run_id, 1).finished is not None  # and the run closes


def test_a_step_whose_evolver_overspent_its_tokens_closes_only_unchanged(
    service: RunService, tiny: ServerTask
) -> None:
    from holedger.schemas.events import GatewayCall, TokenUsage

    runs = EvolveRuns(service)
    terms = runs.terms_for("tiny", batch=3, steps=2, scope=None, step_tokens=100, stream=None)
    run_id = runs.open_run("tiny", terms, optimizer="evolver").run_id
    runs.solve(run_id)
    for total in (60, 41):  # the evolver's calls as the gateway records them: 101 tokens
        call = GatewayCall(
            call_id=f"call-{total}",
            scope="optimizer",
            model_requested="m",
            model_served="m",
            allowed=True,
            status=200,
            tokens=TokenUsage(input=total, total=total),
            reserved=total,
            latency_ms=1,
            request_digest=None,
            response_digest=None,
        )
        service.ledger.append(run_id, "GatewayCall", call, "gateway")
    assert runs.status(run_id)["evolver_tokens_in_step"] == 101
    _refused(
        refusals.EVOLVE_STEP_BUDGET,
        runs.commit_changes,
        run_id,
        1,
        {"harness/__main__.py": PERFECT_MAIN},
        None,
    )
    runs.unchanged(run_id, 1)
    closed = [
        StepClosed.model_validate(r.payload)
        for r in service.ledger.records(run_id)
        if r.type == "StepClosed"
    ]
    assert [(c.outcome, c.evolver_tokens) for c in closed] == [("unchanged", 101)]
    runs.solve(run_id)  # the next step's evolver has its budget whole again
    assert runs.status(run_id)["evolver_tokens_in_step"] == 0
    assert runs.commit_changes(run_id, 2, {"harness/__main__.py": PERFECT_MAIN}, None).finished
    report = assert_replay_verifies(service.ledger, run_id)
    assert next(c for c in report.checks if c.name == "evolve_step_budget").ok
