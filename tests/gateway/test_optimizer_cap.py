"""The optimizer scope is metered and capped: a cap of its own in the run's terms
(``budget.optimizer_tokens``, a generous default when the task names none), reserved
before forwarding like the target scope, restored by a restarted gateway, and checked by
replay (``gateway_optimizer_cap``)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from holedger.gateway.app import create_gateway_app
from holedger.gateway.serve import serve_gateway
from holedger.ledger.store import Ledger
from holedger.protocol.tokens import DEFAULT_OPTIMIZER_TOKENS
from holedger.replay.runs import replay_run
from holedger.schemas.events import TaskTerms

from .helpers import SIM_MODEL, CountingUpstream, Env, close_env, make_terms, open_env

MESSAGES = [{"role": "user", "content": "What was Acme's revenue in 2023?"}]


def capped_terms(optimizer_tokens: int | None) -> TaskTerms:
    terms = make_terms()
    budget = terms.budget.model_copy(update={"optimizer_tokens": optimizer_tokens})
    return terms.model_copy(update={"budget": budget})


def call(base_url: str, token: str, **extra: int) -> httpx.Response:
    body = json.dumps({"model": SIM_MODEL, "messages": MESSAGES, **extra}).encode()
    return httpx.post(
        f"{base_url}/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )


def optimizer_settled(env: Env) -> int:
    return sum(c.tokens.total for c in env.calls() if c.scope == "optimizer")


def test_the_optimizer_cap_refuses_what_would_pass_it(tmp_path: Path) -> None:
    upstream = CountingUpstream()
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", capped_terms(600), upstream_app=upstream)
    try:
        token = env.tokens.issue_optimizer_token(env.run_id)
        statuses = [call(env.base_url, token, max_tokens=100).status_code for _ in range(8)]
        assert statuses[0] == 200 and 402 in statuses
        refused = call(env.base_url, token, max_tokens=100)
        assert refused.status_code == 402
        error = refused.json()["error"]
        assert error["code"] == "budget_exhausted" and "optimizer token budget" in error["message"]
        assert "of 600 remain" in error["message"]
        assert refused.headers["x-should-retry"] == "false"
        forwarded = len(upstream.bodies)
        assert forwarded == statuses.count(200)  # a refused call was never forwarded
        assert optimizer_settled(env) <= 600
        # A trial's calls are not charged to the optimizer's cap, nor the other way.
        assert call(env.base_url, env.trial_token(), max_tokens=100).status_code == 200

        # A gateway started again on the same ledger restores what was settled.
        env.server.stop()
        env.gateway.close()
        env.gateway = create_gateway_app(env.ledger, env.tokens, upstream_app=upstream)
        env.server = serve_gateway(env.gateway)
        assert call(env.base_url, token, max_tokens=100).status_code == 402
        assert len(upstream.bodies) == forwarded + 1  # only the trial's call since

        env.ledger.close_run(env.run_id)
        report = replay_run(env.ledger, env.run_id)
        assert report.verified, report.failures[:3]
        assert "gateway_optimizer_cap" in {c.name for c in report.checks}
        assert report.sections["gateway"]["optimizer_cap"] == 600
    finally:
        close_env(env)


def test_the_default_cap_is_generous_and_still_a_cap(tmp_path: Path) -> None:
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", capped_terms(None))
    try:
        assert (
            "optimizer_tokens"
            not in env.ledger.run_terms(env.run_id).model_dump()["terms"]["budget"]
        )
        token = env.tokens.issue_optimizer_token(env.run_id)
        assert call(env.base_url, token, max_tokens=2**24).status_code == 200
        # Two choices of 2**24 tokens reserve over the default cap of 20 M.
        huge = call(env.base_url, token, max_tokens=2**24, n=2)
        assert huge.status_code == 402
        assert f"of {DEFAULT_OPTIMIZER_TOKENS} remain" in huge.json()["error"]["message"]
    finally:
        close_env(env)


def test_replay_fails_a_run_whose_optimizer_passed_its_cap(tmp_path: Path) -> None:
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", capped_terms(10_000))
    try:
        token = env.tokens.issue_optimizer_token(env.run_id)
        assert call(env.base_url, token, max_tokens=20).status_code == 200
        assert env.gateway.flush(30)
        forged = Ledger.open(f"sqlite:///{tmp_path / 'forged.db'}", env.key)
        records = list(env.ledger.records(env.run_id))
        opened = records[0].typed_payload()
        run_id = forged.open_run(
            opened.terms,  # type: ignore[attr-defined]
            task_digest=opened.task_digest,  # type: ignore[attr-defined]
        )
        for rec in records[1:]:
            if rec.type == "GatewayCall":
                payload = dict(rec.payload)
                payload["tokens"] = dict(payload["tokens"], output=20_000, total=20_000)
                payload["tokens"]["input"] = 0
                payload["request_digest"] = payload["response_digest"] = None
                forged.append(run_id, "GatewayCall", payload, "gateway")
        forged.close_run(run_id)
        report = replay_run(forged, run_id)
        assert "gateway_optimizer_cap" in report.failed_checks()
        forged.close()
    finally:
        close_env(env)
