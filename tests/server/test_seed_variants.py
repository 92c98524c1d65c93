"""A run may start from one of its task's seed variants (``run open --seed-variant``): the
variant tree is candidate 0, its commit is the run's pinned seed, it has a seed baseline
of its own, and replay checks the run against it. The bundled task's two variants (the
anthropic SDK, the Responses API) each run a trial in the bwrap and the Docker sandbox,
every model call recorded in the variant's wire format and checked by replay."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from holedger.config import Settings
from holedger.errors import NotFoundError
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from holedger.schemas.events import GatewayCall, TrialCompleted
from holedger.server.rescore import rescore
from holedger.server.service import RunService, ServerConfig
from holedger.tasks import load_task

from .helpers import assert_replay_verifies
from .tinytask import PERFECT_MAIN, make_task

ENDPOINTS = {"anthropic-sdk": "/v1/messages", "responses-api": "/v1/responses"}


def test_a_variant_seed_has_its_own_commit_baseline_and_replays(
    fresh_home: Settings, tmp_path: Path
) -> None:
    root = tmp_path / "task"
    task = dataclasses.replace(make_task(root), root=root)
    (root / "variants" / "perfect" / "harness").mkdir(parents=True)
    (root / "variants" / "perfect" / "harness" / "__main__.py").write_text(PERFECT_MAIN)
    ledger = Ledger.from_settings(fresh_home)
    service = RunService(
        fresh_home,
        ledger,
        ServerConfig(gateway=None, task_loader=lambda ref: task, default_backend="process"),
    )
    try:
        with pytest.raises(NotFoundError, match="nonesuch") as unknown:
            service.open_run("tiny", seed_variant="nonesuch")
        assert "perfect" in str(unknown.value.hint)  # the hint names those it has
        plain = service.open_run("tiny")
        first = service.open_run("tiny", seed_variant="perfect")
        again = service.open_run("tiny", seed_variant="perfect")
        assert first.seed_commit == again.seed_commit != plain.seed_commit
        assert plain.seed_commit == task.terms.seed_commit
        terms = ledger.run_terms(first.run_id).terms
        assert terms.seed_variant == "perfect" and terms.seed_commit == first.seed_commit
        assert ledger.run_terms(plain.run_id).terms.seed_variant is None
        # The variant's baseline is measured from the variant (it answers every case),
        # once, and is not the task's own seed's.
        assert first.seed_baseline is not None and plain.seed_baseline is not None
        assert first.seed_baseline == again.seed_baseline
        assert first.seed_baseline.e_h0 == 1 != plain.seed_baseline.e_h0
        base = first.seed_baseline.baseline_run_id
        assert base is not None and ledger.run_terms(base).terms.seed_commit == first.seed_commit
        # Its trials run the variant tree.
        ev = service.evaluate(first.run_id, "seed", "dev", None, 1)
        assert all(c["mean"] == "1" for c in ev.projection["cases"].values())
        service.abort(plain.run_id, "test over")
        assert_replay_verifies(ledger, plain.run_id)
        # Its nominee is re-scored from the same seed, so against the same E(H0).
        service.nominate(first.run_id, "seed")
        [again_scored] = rescore(service, first.run_id, 1)
        rescored = ledger.run_terms(again_scored.run_id)
        assert rescored.terms.seed_variant == "perfect"
        assert rescored.seed_baseline == first.seed_baseline
        for run_id in (first.run_id, again_scored.run_id):
            assert_replay_verifies(ledger, run_id)
    finally:
        service.close()
        ledger.close()


def _backend_or_skip(name: str) -> None:
    from holedger.sandboxes.registry import backend

    ok, why = backend(name).available()
    if not ok:
        pytest.skip(f"{name} backend unavailable: {why}")


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(ENDPOINTS))
@pytest.mark.parametrize("sandbox", ["bwrap", "docker"])
def test_a_bundled_variant_runs_a_trial_in_the_sandbox_and_replays(
    fresh_home: Settings, sandbox: str, variant: str
) -> None:
    _backend_or_skip(sandbox)
    task = load_task("officeqa-lite")
    ledger = Ledger.from_settings(fresh_home)
    service = RunService(fresh_home, ledger, ServerConfig(default_backend=sandbox))
    try:
        opened = service.open_run("officeqa-lite", seed_variant=variant, baseline=False)
        assert opened.backend == sandbox
        assert opened.seed_commit != task.terms().seed_commit
        case = task.cases("dev")[0].id
        service.evaluate(opened.run_id, "seed", "dev", [case], 1)
        service.abort(opened.run_id, "one trial is enough")
        records = list(ledger.records(opened.run_id))
        [trial] = [
            TrialCompleted.model_validate(r.payload) for r in records if r.type == "TrialCompleted"
        ]
        assert trial.backend == sandbox and trial.case_id == case
        calls = [GatewayCall.model_validate(r.payload) for r in records if r.type == "GatewayCall"]
        assert calls, trial
        assert all(c.endpoint == ENDPOINTS[variant] and c.trial_id == trial.trial_id for c in calls)
        assert trial.gateway_calls == len(calls)
        assert trial.tokens.total == sum(c.tokens.total for c in calls) > 0
        report = replay_run(ledger, opened.run_id)
        assert report.verified, report.failed_checks()
        gateway = report.sections["gateway"]
        assert gateway["trials_checked"] == 1 and gateway["calls"] == len(calls)
    finally:
        service.close()
        ledger.close()


def test_run_open_names_an_unknown_seed_variant_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cli = [sys.executable, "-m", "holedger", "--home", str(home)]
    subprocess.run([*cli, "init"], capture_output=True, timeout=120, check=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "holedger",
            "--home",
            str(home),
            "run",
            "open",
            "--task",
            "officeqa-lite",
            "--seed-variant",
            "nonesuch",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert "nonesuch" in error["message"] and "anthropic-sdk" in error["hint"]
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
