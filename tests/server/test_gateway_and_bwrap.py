"""Trials that call the target model through the gateway, and trials under bubblewrap."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from holedger.config import Settings
from holedger.errors import ConfigError, PolicyError
from holedger.gateway.config import GatewayConfig, UpstreamConfig
from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.schemas.events import TrialCompleted
from holedger.server.gateway_link import GatewayLink
from holedger.server.service import RunService, ServerConfig

from .helpers import assert_replay_verifies
from .tinytask import make_task, model_task


@contextmanager
def _model_service(
    home: Settings, root: Path, config: GatewayConfig | None = None
) -> Iterator[tuple[RunService, Ledger]]:
    """A service for the model task, its trials calling the gateway in this process."""
    task = model_task(root / "task")
    ledger = Ledger.from_settings(home)
    link = GatewayLink(ledger, config=config)
    service = RunService(
        home,
        ledger,
        ServerConfig(gateway=link, task_loader=lambda r: task, default_backend="process"),
    )
    try:
        yield service, ledger
    finally:
        service.close()
        link.close()
        ledger.close()


@pytest.mark.slow
def test_trials_call_the_model_through_the_gateway_with_their_own_tokens(
    fresh_home: Settings, tmp_path: Path
) -> None:
    with _model_service(fresh_home, tmp_path) as (service, ledger):
        run_id = service.open_run("model").run_id
        ev = service.evaluate(run_id, "seed", "dev", ["dev-1", "dev-2"], 1)
        assert ev.projection["cases"]["dev-1"]["mean"] == "1"
        records = list(ledger.records(run_id))
        trials = [
            TrialCompleted.model_validate(r.payload) for r in records if r.type == "TrialCompleted"
        ]
        calls = [r.payload for r in records if r.type == "GatewayCall"]
        assert trials and calls
        for trial in trials:
            mine = [c for c in calls if c["trial_id"] == trial.trial_id]
            assert trial.gateway_calls == len(mine) >= 1
            assert trial.tokens.total == sum(c["tokens"]["total"] for c in mine) > 0
        # Each trial's token died with its trial.
        from sqlalchemy import select

        from holedger.gateway.tokens import tokens_table

        with ledger.app.engine.connect() as conn:
            rows = conn.execute(
                select(tokens_table.c.trial_id, tokens_table.c.revoked).where(
                    tokens_table.c.run_id == run_id, tokens_table.c.scope == "target"
                )
            ).all()
        assert {row.trial_id for row in rows} == {t.trial_id for t in trials}
        assert all(row.revoked for row in rows)
        service.nominate(run_id, "seed")
        assert_replay_verifies(ledger, run_id)


@pytest.mark.bwrap
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_run_under_bubblewrap_records_isolated_trials(
    fresh_home: Settings, tmp_path: Path
) -> None:
    from holedger.sandboxes import get_backend

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(f"bwrap backend unavailable: {why}")
    task = make_task(tmp_path / "task", k=1)
    ledger = Ledger.from_settings(fresh_home)
    service = RunService(
        fresh_home,
        ledger,
        ServerConfig(gateway=None, task_loader=lambda r: task, default_backend="bwrap"),
    )
    try:
        run_id = service.open_run("tiny").run_id
        ev = service.evaluate(run_id, "seed", "dev", ["dev-0", "dev-1"], 1)
        assert ev.projection["cases"]["dev-1"]["mean"] == "1"
        trials = [
            TrialCompleted.model_validate(r.payload)
            for r in ledger.records(run_id)
            if r.type == "TrialCompleted"
        ]
        assert {t.backend for t in trials} == {"bwrap"}
        assert {t.isolation for t in trials} == {"isolated"}
        service.nominate(run_id, "seed")
        report = assert_replay_verifies(ledger, run_id)
        isolation = [c for c in report.checks if c.name == "isolation"]
        assert len(isolation) == 1
        # on failure, say why: a sandbox that broke is recorded as an unisolated failed
        # trial with a sandbox_error SafetyViolation carrying the cause
        errors = [
            r.payload.get("detail")
            for r in ledger.records(run_id)
            if r.type == "SafetyViolation" and r.payload.get("category") == "sandbox_error"
        ]
        assert all(c.ok for c in isolation), (isolation[0].detail, errors)
    finally:
        service.close()
        ledger.close()


@pytest.mark.slow
def test_the_bundled_demo_task_through_the_gateway_and_simulator(fresh_home: Settings) -> None:
    """officeqa-lite's seed harness (openai SDK) answers dev cases via the simulator."""
    from holedger.server.taskview import load_server_task

    try:
        task = load_server_task("officeqa-lite")
    except Exception as exc:  # the bundled task is another room's; say why it is skipped
        pytest.skip(f"the bundled demo task does not load: {exc}")
    ledger = Ledger.from_settings(fresh_home)
    # The gateway starts on demand.
    service = RunService(fresh_home, ledger, ServerConfig(default_backend="process"))
    try:
        # Held-out scoring of this task is minutes of trials: open without a baseline,
        # search a little, and close the run as aborted.
        run_id = service.open_run("officeqa-lite", baseline=False).run_id
        dev_ids = [c.id for c in task.cases("dev")][:2]
        ev = service.evaluate(run_id, "seed", "dev", dev_ids, 1)
        assert set(ev.projection["cases"]) == set(dev_ids)
        records = list(ledger.records(run_id))
        trials = [
            TrialCompleted.model_validate(r.payload) for r in records if r.type == "TrialCompleted"
        ]
        assert len(trials) == 2
        assert all(t.exit_status == 0 for t in trials), [t.exit_status for t in trials]
        assert all(t.gateway_calls >= 1 and t.tokens.total > 0 for t in trials)
        served = {r.payload["model_served"] for r in records if r.type == "GatewayCall"}
        assert served == {"holedger-sim-1"}
        ledger.close_run(run_id, reason="aborted")
        assert_replay_verifies(ledger, run_id)
    finally:
        service.close()
        ledger.close()


def test_an_unreachable_upstream_is_named_in_the_evaluation(
    fresh_home: Settings, tmp_path: Path
) -> None:
    """Trials whose model calls all fail score 0; the evaluation says why."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = GatewayConfig(upstream=UpstreamConfig(base_url=f"http://127.0.0.1:{port}/v1"))
    with _model_service(fresh_home, tmp_path, config) as (service, ledger):
        run_id = service.open_run("model").run_id
        ev = service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
        assert ev.projection["cases"]["dev-1"]["mean"] == "0"
        # The harness tries five times, then fails for want of a reply.
        assert ev.warnings == [
            "1 of 1 trials gave no answer: exit status 1 (1)",
            "5 of 5 model calls failed: upstream unreachable: ConnectError, status 502 (5)",
            "the gateway could not reach its upstream model: is it running, and is "
            "upstream_base_url in the home's gateway.toml right?",
        ]
        calls = [r.payload for r in ledger.records(run_id) if r.type == "GatewayCall"]
        assert [c["status"] for c in calls] == [502] * 5


def test_a_gateway_that_cannot_start_records_nothing(
    fresh_home: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad gateway.toml (or an unset key variable) fails eval and nominate before any
    decision is recorded: no accepted request is left without trials, nothing is charged,
    and once the setting is mended the run goes on and verifies."""
    task = model_task(tmp_path / "task")
    ledger = Ledger.from_settings(fresh_home)
    service = RunService(
        fresh_home, ledger, ServerConfig(task_loader=lambda r: task, default_backend="process")
    )  # the gateway starts on demand, from the home's gateway.toml
    toml = fresh_home.home / "gateway.toml"
    monkeypatch.delenv("HOLEDGER_TEST_UNSET_KEY", raising=False)
    try:
        run_id = service.open_run("model", baseline=False).run_id
        count = len(list(ledger.records(run_id)))
        for setting in (
            'upstream_api_key_env = "HOLEDGER_TEST_UNSET_KEY"',
            'default_max_tokens = "lots"',
        ):
            toml.write_text(f'[gateway]\nupstream_base_url = "http://127.0.0.1:9/v1"\n{setting}\n')
            with pytest.raises(ConfigError):
                service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
            with pytest.raises(ConfigError):
                service.nominate(run_id, "seed")
            assert len(list(ledger.records(run_id))) == count  # nothing recorded
            assert service.state(run_id).used == rules.no_use()
            # A refusal needs no trials: it is recorded as ever.
            with pytest.raises(PolicyError, match="test split is closed"):
                service.evaluate(run_id, "seed", "test", ["test-1"], 1)
            count += 1
            assert len(list(ledger.records(run_id))) == count
        toml.unlink()  # back to the simulator
        ev = service.evaluate(run_id, "seed", "dev", ["dev-1"], 1)
        assert ev.projection["cases"]["dev-1"]["mean"] == "1"
        ledger.close_run(run_id, reason="aborted")
        assert_replay_verifies(ledger, run_id)
    finally:
        service.close()
        ledger.close()


def test_a_resumed_nomination_counts_only_its_own_model_calls(
    fresh_home: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server dies after the held-out trials ran (their model calls are recorded) and
    before they are: nominating again runs them under new trial ids, and the run verifies
    (each trial's tokens are the sum of its own calls)."""
    with _model_service(fresh_home, tmp_path) as (service, ledger):
        run_id = service.open_run("model").run_id
        append = service.core.append

        def dies_before_scoring(run: str, items: Any) -> None:
            if any(item[0] == "RunScored" for item in items):
                raise RuntimeError("the server died")
            append(run, items)

        monkeypatch.setattr(service.core, "append", dies_before_scoring)
        with pytest.raises(RuntimeError, match="died"):
            service.nominate(run_id, "seed")
        monkeypatch.setattr(service.core, "append", append)
        first = {r.payload["trial_id"] for r in ledger.records(run_id) if r.type == "GatewayCall"}
        assert first  # the cut-short attempt's calls are in the log
        service.nominate(run_id, "seed")
        trials = [r.payload for r in ledger.records(run_id) if r.type == "TrialCompleted"]
        assert trials and not {t["trial_id"] for t in trials} & first
        assert all(t["gateway_calls"] >= 1 for t in trials)
        assert_replay_verifies(ledger, run_id)
