"""The bound on forwarded calls whose events are not yet written (EventRoom).

The ledger's append is held shut by a gate, so the writer falls behind on purpose; calls
beyond ``event_backlog`` must wait unforwarded, and end well whatever happens meanwhile:
the writer catches up, the trial is closed, the client leaves, the writer fails, or the
wait runs out.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from holedger.errors import ConfigError
from holedger.gateway import admission
from holedger.gateway.call_events import CallRecorder
from holedger.gateway.config import GatewayConfig, UpstreamConfig
from holedger.gateway.recorder import Submission
from holedger.ledger.store import Ledger

from .helpers import SIM_MODEL, CountingUpstream, Env, close_env, make_terms, open_env

BODY = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "revenue in 2023?"}]}


class Gate:
    """Holds every ledger append shut until opened; ``fail`` makes the next ones raise."""

    def __init__(self, ledger: Ledger) -> None:
        self.opened = threading.Event()
        self.fail = threading.Event()
        self.entered = threading.Event()
        self._append = ledger.append_many
        ledger.append_many = self  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        assert self.opened.wait(60), "the test never opened the gate"
        if self.fail.is_set():
            raise OSError("disk unplugged (test)")
        return self._append(*args, **kwargs)


def until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


@pytest.fixture
def gated(sqlite_url: str, upstream: CountingUpstream) -> Iterator[tuple[Env, Gate]]:
    config = GatewayConfig(
        upstream=UpstreamConfig(simulator=True), event_backlog=4, blob_cap_bytes=1024
    )
    env = open_env(sqlite_url, make_terms(), config, upstream_app=upstream)
    gate = Gate(env.ledger)
    yield env, gate
    gate.fail.clear()
    gate.opened.set()
    close_env(env)


def fire(env: Env, tokens: list[str], body: dict[str, Any] = BODY) -> list[httpx.Response]:
    """Send one call per token at once over real HTTP; the answers, in token order."""

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=env.base_url, timeout=60) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            "/chat/completions",  # base_url ends in /v1
                            json=body,
                            headers={"authorization": f"Bearer {t}"},
                        )
                        for t in tokens
                    )
                )
            )

    return asyncio.run(main())


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_no_more_than_the_bound_is_forwarded_while_the_writer_is_behind(
    gated: tuple[Env, Gate], upstream: CountingUpstream
) -> None:
    env, gate = gated
    submitted: list[Submission] = []
    submit = env.gateway.writer.submit

    def keep(item: Submission) -> int:
        submitted.append(item)
        return submit(item)

    env.gateway.writer.submit = keep  # type: ignore[method-assign]
    tokens = [env.trial_token(f"t{i}") for i in range(20)]
    long_body = dict(BODY, messages=[{"role": "user", "content": "x" * 5000}])
    thread, out = in_background(lambda: fire(env, tokens, long_body))
    until(lambda: env.gateway.room.waiting == 16, "16 calls wait")
    time.sleep(0.3)  # give any leak the time to show
    assert len(upstream.bodies) == 4  # exactly the bound, none beyond it
    assert env.gateway.room.owed == 4
    # what waits in memory is capped at what the blobs keep (the body sent was 5 kB)
    outcomes = [item.build.__self__ for item in submitted if item.build is not None]
    assert len(outcomes) == 4
    assert all(0 < len(o.call.request_bytes) <= 1024 for o in outcomes)
    gate.opened.set()
    thread.join(60)
    answers = out[0]
    assert len(upstream.bodies) == 20
    codes = [a.json().get("error", {}).get("code") for a in answers if a.status_code != 200]
    assert "ledger_behind" not in codes and "client_gone" not in codes
    calls = env.calls()
    assert len(calls) == 20 and all(c.allowed for c in calls)
    assert "SafetyViolation" not in env.types()


def test_a_trial_closed_while_its_calls_wait_is_not_accused_of_smuggling(
    gated: tuple[Env, Gate], upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, gate = gated
    monkeypatch.setattr(admission, "HOLD_TIMEOUT_S", 120.0)
    token = env.trial_token("t1")
    thread, out = in_background(lambda: fire(env, [token] * 10))
    until(lambda: env.gateway.room.waiting == 6, "6 calls wait")
    closer, usage = in_background(lambda: env.gateway.close_trial(env.run_id, "t1"))
    # close_trial ends their wait: they are refused while the writer is still stuck,
    # long before the hold (made 120 s here) would have run out
    thread.join(20)
    assert not thread.is_alive() and closer.is_alive()  # it still waits for the events
    gate.opened.set()
    closer.join(60)
    statuses = sorted(a.status_code for a in out[0])
    assert statuses.count(403) == 6 and len(upstream.bodies) == 4
    refused = [a.json()["error"]["code"] for a in out[0] if a.status_code == 403]
    assert set(refused) == {"token_revoked"}
    assert usage[0].calls == 10 and usage[0].complete
    calls = env.calls()
    assert sorted(c.code or "" for c in calls if not c.allowed) == ["token_revoked"] * 6
    assert "SafetyViolation" not in env.types()  # the ended trial's own calls, not smuggled


def raw_request(env: Env, token: str) -> socket.socket:
    """A call sent on a socket of its own, so the test can hang up while it waits."""
    body = json.dumps(BODY).encode()
    host, port = env.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"authorization: Bearer {token}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_a_client_that_leaves_while_waiting_is_not_forwarded(
    gated: tuple[Env, Gate], upstream: CountingUpstream
) -> None:
    env, gate = gated
    tokens = [env.trial_token(f"t{i}") for i in range(4)]
    thread, _ = in_background(lambda: fire(env, tokens))
    until(lambda: len(upstream.bodies) == 4, "4 calls are forwarded")
    sock = raw_request(env, env.trial_token("leaver"))
    until(lambda: env.gateway.room.waiting == 1, "the fifth call waits")
    sock.close()
    until(lambda: env.gateway.room.waiting == 0, "the leaver stops waiting")
    gate.opened.set()
    thread.join(60)
    assert len(upstream.bodies) == 4
    [left] = [c for c in env.calls() if c.trial_id == "leaver"]
    assert not left.allowed and left.code == "client_gone" and left.reservation_index is None
    assert env.gateway.room.owed == 0


def test_calls_waiting_when_the_writer_fails_fail_closed(
    gated: tuple[Env, Gate], upstream: CountingUpstream
) -> None:
    env, gate = gated
    tokens = [env.trial_token(f"t{i}") for i in range(6)]
    thread, out = in_background(lambda: fire(env, tokens))
    until(lambda: env.gateway.room.waiting == 2, "2 calls wait")
    gate.fail.set()
    gate.opened.set()
    thread.join(60)
    refused = [a for a in out[0] if a.status_code == 503]
    assert len(refused) == 2 and len(upstream.bodies) == 4
    assert {a.json()["error"]["code"] for a in refused} == {"ledger_unavailable"}
    assert all(a.headers["x-should-retry"] == "false" for a in refused)
    gate.fail.clear()  # the ledger is back: nothing answered meanwhile is lost
    calls = env.calls()
    assert len(calls) == 6
    assert sorted(c.code or "" for c in calls if not c.allowed) == ["ledger_unavailable"] * 2


def test_a_call_waiting_too_long_is_refused_retryable(
    gated: tuple[Env, Gate], upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, gate = gated
    monkeypatch.setattr(admission, "HOLD_TIMEOUT_S", 0.3)
    answers = fire(env, [env.trial_token(f"t{i}") for i in range(5)])
    [late] = [a for a in answers if a.status_code == 503]
    assert late.json()["error"]["code"] == "ledger_behind"
    assert "x-should-retry" not in late.headers  # nothing was forwarded: a retry is safe
    assert len(upstream.bodies) == 4
    gate.opened.set()
    assert len(env.calls()) == 5


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "many", 10**7])
def test_event_backlog_must_be_a_sane_whole_number(value: object) -> None:
    with pytest.raises(ConfigError, match="event_backlog"):
        GatewayConfig.from_mapping({"upstream": "simulator", "event_backlog": value})
    assert (
        GatewayConfig.from_mapping({"upstream": "simulator", "event_backlog": 8}).event_backlog == 8
    )


def test_config_file_sets_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[gateway]\nupstream = "simulator"\nevent_backlog = 16\n')
    assert GatewayConfig.load(path).event_backlog == 16


def test_a_call_revoked_elsewhere_while_it_waits_out_the_hold_is_refused_as_revoked(
    gated: tuple[Env, Gate], upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The token is revoked without close_trial (as another process would), and the wait
    # runs out: the answer must be the final token_revoked, not a retryable ledger_behind
    # whose retry would look like a smuggled token.
    env, gate = gated
    monkeypatch.setattr(admission, "HOLD_TIMEOUT_S", 0.5)
    token = env.trial_token("t1")
    thread, out = in_background(lambda: fire(env, [token] * 5))
    until(lambda: env.gateway.room.waiting == 1, "the fifth call waits")
    env.tokens.revoke_trial(env.run_id, "t1")
    closer, _ = in_background(lambda: env.gateway.close_trial(env.run_id, "t1"))
    thread.join(60)
    [refused] = [a for a in out[0] if a.status_code == 403]
    assert refused.json()["error"]["code"] == "token_revoked"
    assert refused.headers["x-should-retry"] == "false"
    gate.opened.set()
    closer.join(60)
    assert len(upstream.bodies) == 4
    assert "SafetyViolation" not in env.types()


class FailOnce:
    """An upstream whose first call breaks (an exception, no answer) once released."""

    def __init__(self, inner: CountingUpstream) -> None:
        self.inner = inner
        self.inside = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.calls += 1
            if self.calls == 1:
                self.inside.set()
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
                raise RuntimeError("the upstream broke (test)")
        await self.inner(scope, receive, send)


def test_room_left_by_a_call_without_an_event_goes_to_the_next_waiter(
    sqlite_url: str, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer is stuck, so only the leaving call can free the room: the waiter must
    # get it then, not after its wait runs out.
    monkeypatch.setattr(admission, "HOLD_TIMEOUT_S", 10.0)
    record = CallRecorder.record

    def unrecordable_for_trial_a(self: CallRecorder, call: Any, **kw: Any) -> None:
        # The one way a call still ends without an event: recording it fails.
        if call.trial_id == "a":
            raise RuntimeError("recording fails (test)")
        record(self, call, **kw)

    monkeypatch.setattr(CallRecorder, "record", unrecordable_for_trial_a)
    broken = FailOnce(upstream)
    config = GatewayConfig(upstream=UpstreamConfig(simulator=True), event_backlog=1)
    env = open_env(sqlite_url, make_terms(), config, upstream_app=broken)
    gate = Gate(env.ledger)
    try:
        first, first_out = in_background(lambda: fire(env, [env.trial_token("a")]))
        assert broken.inside.wait(20)
        second, second_out = in_background(lambda: fire(env, [env.trial_token("b")]))
        until(lambda: env.gateway.room.waiting == 1, "the second call waits")
        broken.release.set()
        second.join(60)
        first.join(60)
        [answer] = second_out[0]
        assert answer.status_code == 200, answer.text
        assert first_out[0][0].status_code == 500
    finally:
        gate.opened.set()
        close_env(env)
    assert env.gateway.room.owed == 0


def test_events_of_calls_never_forwarded_take_no_room(
    gated: tuple[Env, Gate], upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Model listings (answered by the gateway itself) pile up unwritten behind the stuck
    # writer; a chat call must still be forwarded at once, the room being empty.
    env, gate = gated
    monkeypatch.setattr(admission, "HOLD_TIMEOUT_S", 0.5)
    token = env.trial_token("t1")
    with httpx.Client(base_url=env.base_url, timeout=30) as client:
        for _ in range(10):
            listing = client.get("/models", headers={"authorization": f"Bearer {token}"})
            assert listing.status_code == 200
    assert env.gateway.writer.backlog >= 10 and env.gateway.room.owed == 0
    [answer] = fire(env, [token])
    assert answer.status_code == 200, answer.text
    assert len(upstream.bodies) == 1
    gate.opened.set()


def test_requests_refused_on_their_own_merits_never_wait_for_room(
    gated: tuple[Env, Gate], upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the room full, a disallowed model and a malformed body are still refused at
    # once, as what they are (the model probe stays a SafetyViolation), and take no room.
    env, gate = gated
    monkeypatch.setattr(admission, "HOLD_TIMEOUT_S", 5.0)
    thread, _ = in_background(lambda: fire(env, [env.trial_token(f"t{i}") for i in range(4)]))
    until(lambda: env.gateway.room.owed == 4, "the room is full")
    probe = dict(BODY, model="not-allowed-model")
    with httpx.Client(base_url=env.base_url, timeout=30) as client:
        headers = {"authorization": f"Bearer {env.trial_token('prober')}"}
        refused = client.post("/chat/completions", json=probe, headers=headers)
        malformed = client.post("/chat/completions", content=b"{", headers=headers)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    assert env.gateway.room.owed == 4 and env.gateway.room.waiting == 0
    gate.opened.set()
    thread.join(60)
    assert "SafetyViolation" in env.types()
    [probed] = [c for c in env.calls() if c.trial_id == "prober" and c.model_requested]
    assert probed.code == "model_not_allowed"


def test_a_call_granted_room_after_its_token_died_is_not_forwarded(
    gated: tuple[Env, Gate], upstream: CountingUpstream
) -> None:
    # The token dies while the call waits (revoked elsewhere, no close_trial); room then
    # comes free and is handed to the call, which must still be refused, not forwarded.
    env, gate = gated
    # The late call is sent once the room is full, so it is the one that waits.
    first, _ = in_background(lambda: fire(env, [env.trial_token(f"t{i}") for i in range(4)]))
    until(lambda: env.gateway.room.owed == 4, "the room is full")
    thread, out = in_background(lambda: fire(env, [env.trial_token("late")]))
    until(lambda: env.gateway.room.waiting == 1, "the fifth call waits")
    env.tokens.revoke_trial(env.run_id, "late")
    gate.opened.set()
    first.join(60)
    thread.join(60)
    [late] = out[0]
    assert late.status_code == 403 and late.json()["error"]["code"] == "token_revoked"
    assert len(upstream.bodies) == 4
    [call] = [c for c in env.calls() if c.trial_id == "late"]
    assert not call.allowed and call.reservation_index is None
    assert env.gateway.room.owed == 0
