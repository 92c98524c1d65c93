"""A GatewayCall payload from before the gateway spoke more than chat completions (no
``format``, tokens without ``cache_write``) still validates, and replay checks a call with
no format as a chat completions call."""

from __future__ import annotations

from typing import Any

from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.runs import replay_run
from holedger.schemas.events import GatewayCall

from .helpers import SIM_MODEL, Env


def old_call(call_id: str, index: int, settled: int) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "scope": "target",
        "model_requested": SIM_MODEL,
        "model_served": SIM_MODEL,
        "allowed": True,
        "status": 200,
        "tokens": {"input": 10, "cached": 0, "output": 5, "reasoning": 0, "total": 15},
        "reserved": 100,
        "latency_ms": 3,
        "request_digest": None,
        "response_digest": None,
        "endpoint": "/v1/chat/completions",
        "reservation_index": index,
        "budget": {
            "cap": 1_000_000,
            "settled": settled,
            "outstanding": 0,
            "settled_calls": index,
            "reservations": index,
            "trial_settled": settled,  # calls of no trial count as one trial
        },
    }


def test_old_gateway_calls_verify_and_are_checked_as_chat(env: Env) -> None:
    env.ledger.append_many(
        env.run_id,
        [  # type: ignore[list-item]
            ("GatewayCall", old_call("old-0", 0, 0), "gateway"),
            ("GatewayCall", old_call("old-1", 1, 15), "gateway"),
        ],
    )
    first = env.calls()[0]
    assert first.format is None and first.tokens.cache_write == 0
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
    assert report.verified, [f.model_dump() for f in report.failures]
    assert report.sections["gateway"]["target_settled"] == 30


def test_a_payload_without_format_or_cache_write_validates() -> None:
    # as signed before the fields existed: no "format" member, tokens without cache_write
    call = GatewayCall.model_validate(old_call("old", 0, 0), strict=True)
    assert call.format is None and call.tokens.cache_write == 0
