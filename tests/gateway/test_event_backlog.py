"""The events waiting unwritten in the gateway's memory are bounded (``event_backlog``).

Calls are answered before their events are written; without a bound, a writer that falls
behind lets the waiting events (lost if the process dies) grow without limit. Beyond the
bound the gateway holds new calls until the writer has caught up, and a writer that fails
meanwhile makes the held calls fail closed instead of waiting.
"""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from holedger.errors import ConfigError
from holedger.gateway import app as app_module
from holedger.gateway.config import GatewayConfig
from holedger.gateway.wire import Receive, Scope, Send

from .helpers import SIM_MODEL, CountingUpstream, Env, close_env, make_terms, open_env

MESSAGES = [{"role": "user", "content": "What was Acme's revenue in 2023?"}]


class LedgerWatchingUpstream(CountingUpstream):
    """The simulator, noting for each forwarded call how many GatewayCall events the
    ledger held when the call reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.env: Env | None = None
        self.recorded_on_arrival: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.env is not None:
            records = self.env.ledger.records(self.env.run_id)  # as written so far
            self.recorded_on_arrival.append(sum(r.type == "GatewayCall" for r in records))
        await super().__call__(scope, receive, send)


def test_a_call_is_held_while_the_backlog_is_full(tmp_path: Path) -> None:
    upstream = LedgerWatchingUpstream()
    # The writer lingers a second before writing, so the first call's event waits; with
    # room for one waiting call, the second is held until that event is in the ledger.
    config = GatewayConfig(event_linger_s=1.0, event_backlog=1)
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), config, upstream)
    upstream.env = env
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert env.gateway.writer.backlog == 1  # answered; its event not written yet
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert upstream.recorded_on_arrival == [0, 1]
        assert env.gateway.flush()
        assert len(env.ok_calls()) == 2
    finally:
        close_env(env)


def test_without_a_full_backlog_calls_are_not_held(tmp_path: Path) -> None:
    upstream = LedgerWatchingUpstream()
    config = GatewayConfig(event_linger_s=1.0, event_backlog=8)
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), config, upstream)
    upstream.env = env
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
        for _ in range(3):
            sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert upstream.recorded_on_arrival == [0, 0, 0]  # answered before any was written
        assert env.gateway.flush()
        assert len(env.ok_calls()) == 3
    finally:
        close_env(env)


def test_a_held_call_fails_closed_when_the_writer_fails(tmp_path: Path) -> None:
    config = GatewayConfig(event_backlog=1)
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), config)
    try:
        sdk = openai.OpenAI(
            base_url=env.base_url, api_key=env.trial_token(), max_retries=0, timeout=20
        )
        engine = env.ledger.app.engine
        with engine.begin() as conn:  # the writer cannot store the call's blobs
            conn.exec_driver_sql("ALTER TABLE holedger_blobs RENAME TO holedger_blobs_away")
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)  # answered
        # Its event stays unwritten (the writer retries), so the backlog stays full: the
        # next call is held, and answered 503 once the writer reports its failure.
        with pytest.raises(openai.APIStatusError) as info:
            sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert info.value.status_code == 503
        assert info.value.response.json()["error"]["code"] == "ledger_unavailable"
        assert env.gateway.writer.backlog == 1
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE holedger_blobs_away RENAME TO holedger_blobs")
        assert env.gateway.flush(30)
        deadline = time.monotonic() + 20
        while env.gateway.writer.failure is not None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert env.gateway.flush()
        assert len(env.ok_calls()) == 2  # the held call was refused, not forwarded
    finally:
        close_env(env)


def test_a_call_held_too_long_is_answered_503_and_may_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "HOLD_TIMEOUT_S", 0.2)
    config = GatewayConfig(event_linger_s=5.0, event_backlog=1)  # the writer is slow
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), config)
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        with pytest.raises(openai.APIStatusError) as info:
            sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert info.value.status_code == 503
        assert info.value.response.json()["error"]["code"] == "ledger_behind"
        assert "x-should-retry" not in info.value.response.headers  # the SDK may retry
        assert env.gateway.flush()
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        assert len(env.ok_calls()) == 2  # the held call was not forwarded
    finally:
        close_env(env)


@pytest.mark.parametrize("value", [0, -3, 1.5, True, "many"])
def test_a_bad_backlog_setting_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="event_backlog"):
        GatewayConfig.from_mapping({"upstream": "simulator", "event_backlog": value})


def test_the_backlog_setting_is_read() -> None:
    config = GatewayConfig.from_mapping({"upstream": "simulator", "event_backlog": 64})
    assert config.event_backlog == 64
    assert GatewayConfig().event_backlog == 1024
