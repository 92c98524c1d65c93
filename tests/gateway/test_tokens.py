"""Tokens: stored hashed, bound to one trial, dead when the trial ends; smuggling attacked."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from holedger.cli import cli
from holedger.config import Settings
from holedger.gateway.app import CallerBinding
from holedger.gateway.tokens import TokenClaims, TokenRegistry, tokens_table
from holedger.ledger.store import Ledger
from holedger.schemas.events import GatewayCall, SafetyViolation

from .helpers import SIM_MODEL, Env, digest, make_terms

MESSAGES = [{"role": "user", "content": "hello"}]


def on_socket(path: Path, token: str) -> openai.OpenAI:
    """An SDK client whose connections go to the unix socket ``path`` (as in a sandbox)."""
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(path)))
    return openai.OpenAI(
        base_url="http://gateway/v1", api_key=token, http_client=http, max_retries=0
    )


def bind_trial(env: Env, tmp_path: Path, trial_id: str, run_id: str | None = None) -> Path:
    path = tmp_path / f"{trial_id}.sock"
    binding = CallerBinding(
        run_id=run_id or env.run_id,
        scope="target",
        trial_id=trial_id,
        request_id="r1",
        case_id="c1",
        attempt=0,
    )
    env.server.bind_unix(path, binding)
    return path


def violations(env: Env, run_id: str) -> list[SafetyViolation]:
    env.gateway.flush()
    out = []
    for rec in env.ledger.records(run_id):
        payload = rec.typed_payload()
        if isinstance(payload, SafetyViolation):
            out.append(payload)
    return out


def refused(client: openai.OpenAI) -> str:
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
    assert info.value.response.headers["x-should-retry"] == "false"
    code: str = info.value.response.json()["error"]["code"]
    return code


def test_tokens_are_stored_only_as_their_sha256(env: Env) -> None:
    token = env.trial_token()
    with env.ledger.app.engine.connect() as conn:
        rows = conn.execute(select(tokens_table)).all()
    assert [r.token_hash for r in rows] == [hashlib.sha256(token.encode()).hexdigest()]
    assert all(token not in str(tuple(r)) for r in rows)


def test_the_trials_own_token_on_its_socket_is_served(env: Env, tmp_path: Path) -> None:
    path = bind_trial(env, tmp_path, "t1")
    completion = on_socket(path, env.trial_token("t1")).chat.completions.create(
        model=SIM_MODEL, messages=MESSAGES
    )
    assert completion.choices
    assert [c.trial_id for c in env.calls()] == ["t1"]


def test_another_trials_token_is_refused_and_recorded(env: Env, tmp_path: Path) -> None:
    path = bind_trial(env, tmp_path, "t1")
    assert refused(on_socket(path, env.trial_token("t2"))) == "token_wrong_trial"
    (event,) = env.calls()
    assert event.trial_id == "t1" and event.presented is not None
    assert event.presented.trial_id == "t2" and not event.allowed and event.status == 403
    (violation,) = violations(env, env.run_id)
    assert violation.category == "foreign_token" and violation.call_id == event.call_id


def test_another_runs_token_is_refused_and_recorded_on_both_runs(env: Env, tmp_path: Path) -> None:
    other_run = env.ledger.open_run(make_terms(), task_digest=digest("other"))
    path = bind_trial(env, tmp_path, "t1")
    smuggled = env.trial_token("t1", run_id=other_run)  # even the same trial name
    assert refused(on_socket(path, smuggled)) == "token_wrong_run"
    (event,) = env.calls()
    assert event.presented is not None and event.presented.run_id == other_run
    assert [v.category for v in violations(env, env.run_id)] == ["foreign_token"]
    assert [v.category for v in violations(env, other_run)] == ["foreign_token"]


def test_the_optimizer_token_is_refused_inside_a_trial(env: Env, tmp_path: Path) -> None:
    path = bind_trial(env, tmp_path, "t1")
    optimizer = env.tokens.issue_optimizer_token(env.run_id)
    assert refused(on_socket(path, optimizer)) == "token_wrong_scope"
    (event,) = env.calls()
    assert event.presented is not None and event.presented.scope == "optimizer"
    assert len(violations(env, env.run_id)) == 1


def test_an_expired_token_is_refused(env: Env, tmp_path: Path) -> None:
    path = bind_trial(env, tmp_path, "t1")
    expired = env.tokens.issue_trial_token(
        env.run_id, request_id="r1", trial_id="t1", case_id="c1", attempt=0, ttl_s=0
    )
    assert refused(on_socket(path, expired)) == "token_expired"
    # Over TCP too, where no listener names the caller: recorded on the token's run.
    sdk = openai.OpenAI(base_url=env.base_url, api_key=expired, max_retries=0)
    assert refused(sdk) == "token_expired"
    assert len(violations(env, env.run_id)) == 2


def test_a_token_dies_when_its_trial_ends(env: Env) -> None:
    token = env.trial_token("t1")
    sdk = openai.OpenAI(base_url=env.base_url, api_key=token, max_retries=0)
    sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
    usage = env.gateway.close_trial(env.run_id, "t1")
    assert usage.complete and usage.calls == len(env.calls())
    assert refused(sdk) == "token_revoked"
    # The refused call is not attributed to the finished trial (its totals stay closed).
    assert env.gateway.trial_usage(env.run_id, "t1") == usage
    late = env.calls()[-1]
    assert late.trial_id is None and late.presented is not None
    assert late.presented.state == "revoked"


def test_revocation_in_another_process_is_seen(env: Env) -> None:
    token = env.trial_token("t1")
    other = TokenRegistry(env.ledger.app.engine, cache_ttl_s=0)
    assert other.lookup(token) is not None
    env.tokens.revoke_trial(env.run_id, "t1")
    claims = other.lookup(token)
    assert claims is not None and claims.state() == "revoked"


def test_cli_optimizer_token_is_metered_not_capped(tmp_path: Path) -> None:
    settings = Settings.resolve(tmp_path / "home")
    key, _ = Ledger.init_home(settings)
    ledger = Ledger.open(settings.ledger_url, key)
    run_id = ledger.open_run(make_terms(target_tokens=10), task_digest=digest("t"))
    result = CliRunner().invoke(cli, ["--home", str(settings.home), "token", run_id[:8], "--json"])
    assert result.exit_code == 0, result.output
    import json

    token = json.loads(result.output)["token"]
    from holedger.gateway.app import create_gateway_app
    from holedger.gateway.serve import serve_gateway

    gateway = create_gateway_app(ledger)  # a registry of its own, on the same database
    server = serve_gateway(gateway)
    try:
        sdk = openai.OpenAI(base_url=server.base_url, api_key=token, max_retries=0)
        sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)  # cap is 10 tokens
        gateway.flush()
        (event,) = [r.typed_payload() for r in ledger.records(run_id) if r.type == "GatewayCall"]
        assert isinstance(event, GatewayCall)
        assert event.scope == "optimizer" and event.allowed and event.tokens.total > 10
        assert event.reservation_index is None and event.trial_id is None
    finally:
        server.stop()
        gateway.close()
        ledger.close()


def test_cli_token_for_an_unknown_run_is_one_line_exit_2(tmp_path: Path) -> None:
    settings = Settings.resolve(tmp_path / "home")
    Ledger.init_home(settings)
    result = CliRunner().invoke(cli, ["--home", str(settings.home), "token", "deadbeef"])
    assert result.exit_code == 2
    assert "no run deadbeef" in result.output


def test_a_read_that_overlaps_a_revocation_is_not_cached(env: Env) -> None:
    """The database row read just before the trial ended must not keep the token alive."""
    token = env.trial_token("t1")

    class Racing(TokenRegistry):
        def _load(self, digest: str) -> TokenClaims | None:
            claims = super()._load(digest)  # read while the token was live...
            if claims is not None and not claims.revoked:
                self.revoke_trial(env.run_id, "t1")  # ...and the trial ends meanwhile
            return claims

    registry = Racing(env.ledger.app.engine)
    first = registry.lookup(token)
    assert first is not None and first.state() == "live"  # the call raced the end
    again = registry.lookup(token)
    assert again is not None and again.state() == "revoked"


def test_a_token_in_use_is_reread_in_the_background(env: Env) -> None:
    token = env.trial_token("t1")
    readers: list[str] = []

    class Watched(TokenRegistry):
        def _load(self, digest: str) -> TokenClaims | None:
            readers.append(threading.current_thread().name)
            return super()._load(digest)

    registry = Watched(env.ledger.app.engine, cache_ttl_s=1.0)
    assert registry.lookup(token) is not None
    env.tokens.revoke_trial(env.run_id, "t1")  # another process's revocation
    time.sleep(0.55)  # past half the time to live: served from the cache, re-read behind
    assert registry.lookup(token) is not None
    assert registry._refresher is not None
    registry._refresher.submit(lambda: None).result(10)  # the re-read is done
    claims = registry.lookup(token)
    assert claims is not None and claims.state() == "revoked"
    assert readers[0] == threading.current_thread().name
    assert any(name.startswith("holedger-tokens") for name in readers[1:])
