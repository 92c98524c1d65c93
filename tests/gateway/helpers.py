"""Helpers: a temporary ledger with one open run, a token registry, a live gateway."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sample_terms import task_terms

from holedger.gateway.app import Gateway, create_gateway_app
from holedger.gateway.config import GatewayConfig
from holedger.gateway.serve import AppServer, serve_gateway
from holedger.gateway.sim_server import create_simulator_app
from holedger.gateway.tokens import TokenRegistry
from holedger.gateway.wire import ASGIApp, Message, Receive, Scope, Send
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.schemas.events import GatewayCall, TaskTerms, TokenUsage, TrialCompleted

SIM_MODEL = "holedger-sim-1"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_terms(target_tokens: int = 1_000_000, per_trial: int | None = None) -> TaskTerms:
    return task_terms(
        "gateway-test",
        models=[SIM_MODEL, "alias-model"],
        target_tokens=target_tokens,
        per_trial_tokens=per_trial,
        immutable_paths=[],
    )


@dataclass
class Env:
    ledger: Ledger
    key: SigningKey
    tokens: TokenRegistry
    gateway: Gateway
    server: AppServer
    run_id: str

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def trial_token(self, trial_id: str = "t1", run_id: str | None = None) -> str:
        return self.tokens.issue_trial_token(
            run_id or self.run_id, request_id="r1", trial_id=trial_id, case_id="c1", attempt=0
        )

    def calls(self, run_id: str | None = None) -> list[GatewayCall]:
        assert self.gateway.flush(30)
        out = []
        for rec in self.ledger.records(run_id or self.run_id):
            if rec.type == "GatewayCall":
                payload = rec.typed_payload()
                assert isinstance(payload, GatewayCall)
                out.append(payload)
        return out

    def ok_calls(self, run_id: str | None = None) -> list[GatewayCall]:
        """Calls the upstream answered 200 (the simulator fails a few calls on purpose)."""
        return [c for c in self.calls(run_id) if c.status == 200]

    def by_id(self, call_id: str, run_id: str | None = None) -> GatewayCall:
        matches = [c for c in self.calls(run_id) if c.call_id == call_id]
        assert len(matches) == 1, f"{len(matches)} GatewayCall events for {call_id}"
        return matches[0]

    def types(self, run_id: str | None = None) -> list[str]:
        assert self.gateway.flush(30)
        return [rec.type for rec in self.ledger.records(run_id or self.run_id)]


def open_env(
    url: str,
    terms: TaskTerms,
    config: GatewayConfig | None = None,
    upstream_app: ASGIApp | None = None,
) -> Env:
    key = SigningKey.generate("gateway-test")
    ledger = Ledger.open(url, key)
    run_id = ledger.open_run(terms, task_digest=digest("task"))
    tokens = TokenRegistry(ledger.app.engine)
    gateway = create_gateway_app(ledger, tokens, config, upstream_app=upstream_app)
    server = serve_gateway(gateway)
    return Env(ledger, key, tokens, gateway, server, run_id)


def close_env(e: Env) -> None:
    e.server.stop()
    e.gateway.close()
    e.ledger.close()


class CountingUpstream:
    """The simulator's HTTP face, counting and keeping the bodies forwarded to it."""

    def __init__(self, chunk_delay_s: float = 0.0) -> None:
        self.inner = create_simulator_app(chunk_delay_s=chunk_delay_s)
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if raw:
            self.bodies.append(json.loads(raw))
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.inner(scope, replay, send)


def trial_completed(env: Env, trial_id: str) -> TrialCompleted:
    """Close the trial at the gateway and say what its TrialCompleted must carry."""
    usage = env.gateway.close_trial(env.run_id, trial_id)
    assert usage.complete
    return completed_trial(trial_id, usage.tokens, usage.calls)


def completed_trial(trial_id: str, tokens: TokenUsage, calls: int) -> TrialCompleted:
    """A TrialCompleted of a dev trial reporting ``tokens`` in ``calls`` gateway calls."""
    return TrialCompleted(
        request_id="r1",
        trial_id=trial_id,
        candidate="c" * 40,
        split="dev",
        case_id="c1",
        attempt=0,
        backend="process",
        isolation="isolated",
        limits={},
        exit_status=0,
        timed_out=False,
        oom=False,
        wall_ms=1,
        answer_digest=None,
        output_digest=None,
        trace_digest=None,
        score="1",
        tokens=tokens,
        gateway_calls=calls,
    )
