"""Replay re-derives the token budget; edited, validly re-signed events are caught."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from holedger.gateway.formats import FORMATS
from holedger.ledger.store import Ledger
from holedger.protocol.endpoints import METERED_PATHS, MODEL_PATHS
from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.report import ReplayReport
from holedger.replay.runs import replay_run as full_replay

from .helpers import SIM_MODEL, Env, close_env, digest, make_terms, open_env, trial_completed

MESSAGES = [{"role": "user", "content": "What was Acme's revenue in 2023?"}]
CAP = 450
Edit = Callable[[str, dict[str, Any]], dict[str, Any] | None]


def replay_run(ledger: Ledger, run_id: str) -> ReplayReport:
    """Integrity plus the gateway projection (the other rooms' protocol checks need a full
    protocol run, which these gateway-only runs do not have)."""
    return full_replay(ledger, run_id, checks=[GatewayFold])


@pytest.fixture
def finished_run(sqlite_url: str) -> Env:
    """Two trials call until the run's small cap denies them; both trials complete."""
    env = open_env(sqlite_url, make_terms(target_tokens=CAP))
    for trial in ("a", "b"):
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(trial), max_retries=0)
        for _ in range(4):
            try:
                sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=80)
            except openai.APIStatusError:
                pass
        with pytest.raises(openai.PermissionDeniedError):
            sdk.chat.completions.create(model="not-allowed", messages=MESSAGES)
        env.ledger.append(env.run_id, "TrialCompleted", trial_completed(env, trial), "server")
    env.ledger.close_run(env.run_id)
    return env


def copy_run(env: Env, tmp_path: Path, edit: Edit) -> ReplayReport:
    """Rebuild the run in a fresh ledger through the low-level API, with one edit, signed
    with the same valid key: only the gateway checks can tell."""
    forged = Ledger.open(f"sqlite:///{tmp_path / 'forged.db'}", env.key)
    try:
        run_id = forged.open_run(env.ledger.run_terms(env.run_id).terms, task_digest=digest("task"))
        for rec in env.ledger.records(env.run_id):
            if rec.type in ("RunOpened", "Checkpoint", "RunClosed"):
                continue
            for name in ("request_digest", "response_digest", "evidence_digest"):
                if rec.payload.get(name):
                    forged.put_blob(env.ledger.get_blob(rec.payload[name]))
            payload = edit(rec.type, dict(rec.payload))
            if payload is not None:
                forged.append(run_id, rec.type, payload, rec.role)  # type: ignore[arg-type]
        forged.close_run(run_id)
        return replay_run(forged, run_id)
    finally:
        forged.close()


def unchanged(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def test_the_honest_run_replays_clean(finished_run: Env, tmp_path: Path) -> None:
    env = finished_run
    report = replay_run(env.ledger, env.run_id)
    assert report.verified, report.failed_checks()
    section = report.sections["gateway"]
    assert section["denied"]["budget_exhausted"] >= 1
    assert section["denied"]["model_not_allowed"] == 2
    assert section["overshoot"] == 0 and section["target_settled"] <= CAP
    assert section["trials_checked"] == 2
    names = {c.name for c in report.checks}
    assert {"gateway_budget", "gateway_trial_totals", "gateway_allowlist"} <= names
    # The copy machinery alone does not break anything.
    assert copy_run(env, tmp_path, unchanged).verified
    close_env(env)


def test_edited_call_tokens_break_the_trials_totals(finished_run: Env, tmp_path: Path) -> None:
    env = finished_run
    done = False

    def shave(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        nonlocal done
        if event_type == "GatewayCall" and payload["allowed"] and not done:
            done = True
            tokens = dict(payload["tokens"])
            tokens["output"] -= 5
            tokens["total"] -= 5
            payload["tokens"] = tokens
        return payload

    report = copy_run(env, tmp_path, shave)
    assert not report.verified
    assert "gateway_trial_totals" in report.failed_checks()
    close_env(env)


def test_a_denied_call_recorded_as_allowed_over_the_cap_fails(
    finished_run: Env, tmp_path: Path
) -> None:
    env = finished_run

    def allow(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event_type == "GatewayCall" and payload.get("code") == "budget_exhausted":
            payload.update(allowed=True, code=None, reason=None, status=200)
        return payload

    report = copy_run(env, tmp_path, allow)
    assert not report.verified
    assert "gateway_budget" in report.failed_checks()
    close_env(env)


def test_a_forged_reservation_over_the_cap_fails(finished_run: Env, tmp_path: Path) -> None:
    """A forger who also invents the reservation bookkeeping is caught by the re-derivation."""
    env = finished_run
    done = False

    def forge(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        nonlocal done
        if event_type == "GatewayCall" and payload.get("code") == "budget_exhausted" and not done:
            done = True
            state = payload["budget"]
            payload.update(
                allowed=True,
                code=None,
                reason=None,
                status=200,
                reservation_index=state["reservations"],
                tokens={"input": 10, "cached": 0, "output": 5, "reasoning": 0, "total": 15},
            )
        return payload

    report = copy_run(env, tmp_path, forge)
    assert not report.verified
    assert "gateway_budget" in report.failed_checks()
    close_env(env)


def test_dropping_a_call_fails_replay(finished_run: Env, tmp_path: Path) -> None:
    env = finished_run
    dropped = False

    def drop(event_type: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal dropped
        if event_type == "GatewayCall" and payload["allowed"] and not dropped:
            dropped = True
            return None
        return payload

    report = copy_run(env, tmp_path, drop)
    assert not report.verified
    assert {"gateway_budget", "gateway_trial_totals"} & set(report.failed_checks())
    close_env(env)


def test_a_model_outside_the_allow_list_recorded_as_allowed_fails(
    finished_run: Env, tmp_path: Path
) -> None:
    env = finished_run

    def swap(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event_type == "GatewayCall" and payload["allowed"]:
            payload["model_requested"] = "gpt-4o"
        return payload

    report = copy_run(env, tmp_path, swap)
    assert "gateway_allowlist" in report.failed_checks()
    close_env(env)


def test_replay_knows_every_endpoint_the_gateway_serves() -> None:
    # Replay reads the endpoints from the protocol, not from the gateway: a format served
    # on a path the protocol does not list would have its calls' allow-list and
    # reservations go unchecked.
    assert set(FORMATS) == MODEL_PATHS
    assert "/v1/messages/count_tokens" in METERED_PATHS  # reserves its prompt's bound
