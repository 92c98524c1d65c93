"""If an event still cannot be built or written, that one call is recorded as refused,
the writer goes on, and nothing already accepted is lost.

The gateway's own numbers are bounded at the source (test_request_bounds,
test_exact_range); these tests break an event on purpose, the way a fault of the
gateway's own would, and check what the writer does with the batch around it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from holedger.gateway import call_events
from holedger.gateway.fallback import UNRECORDABLE_CODE
from holedger.gateway.recorder import EventWriter, Submission
from holedger.replay.runs import replay_run

from .helpers import SIM_MODEL, close_env, completed_trial, make_terms, open_env

BODY = b'{"model":"' + SIM_MODEL.encode() + b'","messages":[{"role":"user","content":"hi"}]}'


def post(base_url: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}/chat/completions",
        content=BODY,
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_an_event_that_cannot_be_built_is_recorded_as_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms())
    try:
        real = call_events.Outcome.events
        poisoned: list[str] = []

        def events(self: Any) -> Any:
            if self.call.trial_id == "poison":
                poisoned.append(self.call.call_id)
                raise ValueError("integer out of the exact JSON range (simulated)")
            return real(self)

        monkeypatch.setattr(call_events.Outcome, "events", events)
        good, bad = env.trial_token("good"), env.trial_token("poison")
        first = post(env.base_url, good)
        poisoned_resp = post(env.base_url, bad)
        after = post(env.base_url, good)
        assert {first.status_code, after.status_code} <= {200, 502}
        assert poisoned_resp.status_code in (200, 502)
        assert env.gateway.flush(30) and env.gateway.writer.failure is None
        calls = {c.call_id: c for c in env.calls()}
        assert first.headers["x-holedger-call-id"] in calls  # nothing accepted is lost
        assert after.headers["x-holedger-call-id"] in calls  # and the writer went on
        [refused] = [calls[i] for i in poisoned]
        assert refused.code == UNRECORDABLE_CODE and not refused.allowed
        assert refused.tokens.total == 0 and refused.trial_id == "poison"
        assert env.gateway.writer.unbuildable == 1
        assert post(env.base_url, good).status_code in (200, 502)  # still serving
    finally:
        close_env(env)


def test_a_batch_the_ledger_refuses_is_written_call_by_call(tmp_path: Path) -> None:
    """One submission whose payload the ledger cannot encode (an integer beyond 2**53, as
    a dict that bypasses the typed models) does not take its batch down: the others are
    written, the bad one is replaced by its fallback, and the writer has not failed."""
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms())
    try:
        env.server.stop()
        env.gateway.close()
        writer = EventWriter(env.ledger, linger_s=0.5)  # one batch for all three
        ok = completed_trial("t-ok", _zero(), 0)
        bad = ok.model_dump(mode="json") | {"trial_id": "t-bad", "wall_ms": 2**64}
        fallback_used: list[str] = []

        def fallback(reason: str) -> Any:
            fallback_used.append(reason)
            return [("TrialCompleted", completed_trial("t-bad", _zero(), 0), "server")]

        later = completed_trial("t-later", _zero(), 0)
        writer.submit(Submission(env.run_id, events=[("TrialCompleted", ok, "server")]))
        writer.submit(
            Submission(env.run_id, events=[("TrialCompleted", bad, "server")], fallback=fallback)
        )
        writer.submit(Submission(env.run_id, events=[("TrialCompleted", later, "server")]))
        assert writer.flush(30) and writer.failure is None
        trials = [
            r.payload["trial_id"]
            for r in env.ledger.records(env.run_id)
            if r.type == "TrialCompleted"
        ]
        assert trials == ["t-ok", "t-bad", "t-later"]
        assert len(fallback_used) == 1 and writer.unbuildable == 1
        writer.close()
        env.ledger.close_run(env.run_id)
        assert replay_run(env.ledger, env.run_id, checks=()).verified
    finally:
        env.ledger.close()


def _zero() -> Any:
    from holedger.schemas.events import TokenUsage

    return TokenUsage()
