"""The model gateway: an ASGI app that meters and records every call.

Each wire format in ``holedger.gateway.formats`` (chat completions, Responses,
embeddings, Anthropic Messages and count_tokens; plain and SSE) is served on its path,
and ``GET /v1/models``; anything else is a 404 in the OpenAI error shape. Each call is
checked in this order, and the first failing check answers (nothing is forwarded), in
the error shape of the call's format:

1. the token: present (401), known (401), live, and issued for the caller the listener
   expects (403, plus a SafetyViolation "foreign_token");
2. the body: at most ``max_body_bytes`` (413), JSON (400), a request of the format (400),
   no server-side tool the terms do not allow (403);
3. the model: exactly in the scope's allow-list (403, SafetyViolation "model_not_allowed");
   an alias is resolved only afterwards and both names are recorded;
4. an upstream that serves the model in this format (400);
5. the budget (target scope): reserve ``prompt bound + n * output limit`` or answer 402.

Every call that can be attributed to a run becomes one signed GatewayCall event. Budget
decisions and settlements hand their event to the writer while holding the run's budget
lock, so the ledger holds them in decision order and replay can re-derive each decision.
One gateway process serves a ledger's runs (the budget state is in its memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel

from holedger.errors import NotFoundError
from holedger.gateway.budget import RunBudget, add_usage
from holedger.gateway.closing import CLOSE_WAIT_S, RUN_CLOSED_CODE, RunGate, run_closed_message
from holedger.gateway.config import GatewayConfig
from holedger.gateway.denial import Denial as _Denial
from holedger.gateway.fallback import refused_events as refused
from holedger.gateway.formats import CHAT, Limits, UsageError, WireFormat, format_for_path
from holedger.gateway.optimizer_budget import OptimizerBudget, optimizer_cap, optimizer_refusal
from holedger.gateway.recorder import EventRoom, EventWriter, Submission
from holedger.gateway.routing import Poster, Router
from holedger.gateway.tokens import TokenClaims, TokenRegistry
from holedger.gateway.upstream import UpstreamError
from holedger.gateway.wire import (
    JSON_TYPE,
    NO_RETRY,
    SSE_TYPE,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    bearer_token,
    send_bytes,
)
from holedger.ledger.closing import register_gateway, unregister_gateway
from holedger.ledger.store import Ledger
from holedger.schemas.canonical import canonical_json, has_utf8_form
from holedger.schemas.events import (
    GatewayBudgetState,
    GatewayCall,
    PresentedToken,
    SafetyViolation,
    TokenUsage,
)
from holedger.schemas.types import Role, exact_count
from holedger.schemas.untrusted import escape_text

log = logging.getLogger("holedger.gateway")
MODELS_PATH = "/v1/models"
ZERO = TokenUsage()
# How long a call waits for room while the event writer is behind (then 503 ledger_behind).
HOLD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CallerBinding:
    """Who may call on one listener (a trial's unix socket): calls with any other token
    are refused as smuggled."""

    run_id: str
    scope: Literal["target", "optimizer"]
    trial_id: str | None = None
    request_id: str | None = None
    case_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class TrialUsage:
    """A trial's gateway calls so far: their count, their token sum, and whether none of
    them was still in flight when this was read."""

    tokens: TokenUsage
    calls: int
    complete: bool
    # Calls that ended in an error, by error code (else reason, else "status N").
    failed: dict[str, int] = field(default_factory=dict)


@dataclass
class _Tally:
    calls: int = 0
    tokens: TokenUsage = ZERO
    in_flight: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    def count_failure(self, status: int, code: str | None, reason: str | None) -> None:
        if status >= 400:
            # A denial has a code; an upstream's error has a reason, and its status tells
            # one (a 401, a 429) from another.
            key = code or (f"{reason[:80]}, status {status}" if reason else f"status {status}")
            self.failed[key] = self.failed.get(key, 0) + 1


@dataclass
class _RunState:
    models: frozenset[str]
    budget: RunBudget
    server_tools: frozenset[str] = frozenset()  # server-side tools the terms allow
    optimizer: OptimizerBudget = field(default_factory=lambda: OptimizerBudget(0))


@dataclass
class _Call:
    """One request as it goes through the checks; becomes one GatewayCall."""

    call_id: str
    t0: float
    endpoint: str
    fmt: WireFormat = CHAT
    run_id: str | None = None
    scope: Literal["target", "optimizer"] = "target"
    request_id: str | None = None
    trial_id: str | None = None
    case_id: str | None = None
    attempt: int | None = None
    stream: bool = False
    model_requested: str | None = None
    model_served: str | None = None
    request_bytes: bytes = b""
    reserved: int = 0
    prompt_bound: int = 0
    max_tokens_imposed: int | None = None
    reservation_index: int | None = None
    budget: GatewayBudgetState | None = None
    presented: PresentedToken | None = None
    tracked: bool = False  # counted in its trial's calls in flight
    admitted: bool = False  # holds room in the EventRoom until its event is submitted
    forwarded: bool = False  # handed to the upstream (it may have done the work)
    recorded: bool = False  # its GatewayCall has been handed to the writer
    responded: bool = False  # the response has started (a streamed one is under way)
    gated: str | None = None  # the run whose calls in flight count this one (RunGate)

    def attribute(self, claims: TokenClaims | CallerBinding) -> None:
        self.run_id = claims.run_id
        self.scope = claims.scope
        self.request_id = claims.request_id
        self.trial_id = claims.trial_id
        self.case_id = claims.case_id
        self.attempt = claims.attempt


class _CallIds:
    """Unique call ids without a system call each: a random prefix and a counter."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16]
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


class Gateway:
    """The ASGI app. Construct with the ledger, the token registry and the configuration."""

    def __init__(
        self,
        ledger: Ledger,
        tokens: TokenRegistry,
        config: GatewayConfig | None = None,
        *,
        upstream_app: ASGIApp | None = None,
    ) -> None:
        self.ledger = ledger
        self.tokens = tokens
        self.config = config or GatewayConfig()
        self.writer = EventWriter(ledger, linger_s=self.config.event_linger_s)
        self.room = EventRoom(self.writer, self.config.event_backlog)
        self._runs: dict[str, _RunState] = {}
        self._runs_lock = threading.Lock()
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self._tally_cond = threading.Condition()
        self._bindings: dict[str, CallerBinding] = {}
        self._router = Router(self.config, upstream_app)
        self._limits = Limits(
            default_max_tokens=self.config.default_max_tokens,
            max_tokens_field=self.config.max_tokens_field,
            media_part_tokens=self.config.media_part_tokens,
        )
        self._ids = _CallIds()
        self.gate = RunGate()
        self.writer.on_closed = self.gate.shut  # the ledger refused a run: it has closed
        ledger.close_hooks.append(self.close_run)
        self._instance = register_gateway(ledger.app.engine)

    # ------------------------------------------------------------------ public API

    def bind(self, listener: str, binding: CallerBinding) -> None:
        """Expect only ``binding``'s token on the unix socket at path ``listener``."""
        self._bindings[listener] = binding

    def unbind(self, listener: str) -> None:
        self._bindings.pop(listener, None)

    def trial_usage(self, run_id: str, trial_id: str) -> TrialUsage:
        with self._tally_cond:
            tally = self._tallies.get((run_id, trial_id), _Tally())
            return TrialUsage(tally.tokens, tally.calls, tally.in_flight == 0, dict(tally.failed))

    def close_trial(self, run_id: str, trial_id: str, *, wait_s: float = 30.0) -> TrialUsage:
        """End a trial: revoke its tokens, wait for its calls in flight, write their events,
        and return its totals (what TrialCompleted.tokens and .gateway_calls must say)."""
        self.tokens.revoke_trial(run_id, trial_id)
        self.room.withdraw((run_id, trial_id))  # its calls waiting for room end now
        with self._tally_cond:
            self._tally_cond.wait_for(
                lambda: self._tallies.get((run_id, trial_id), _Tally()).in_flight == 0,
                timeout=wait_s,
            )
        self.writer.flush(wait_s)
        return self.trial_usage(run_id, trial_id)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every event so far is in the ledger."""
        return self.writer.flush(timeout)

    def close_run(self, run_id: str) -> None:
        """The run closes (the ledger's close hook, before RunClosed): refuse its calls,
        wait for those in flight and write their events (gateway.closing)."""
        self.gate.shut(run_id)
        self.tokens.forget_run(run_id)
        self.room.withdraw((run_id, None))  # its optimizer calls waiting for room end now
        self.gate.wait_idle(run_id)
        self.writer.flush(CLOSE_WAIT_S)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.ledger.close_hooks.remove(self.close_run)
        unregister_gateway(self.ledger.app.engine, self._instance)
        self.writer.close()

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        call = _Call(self._ids.next(), time.perf_counter(), path)
        fmt = format_for_path(path)
        if fmt is not None:
            call.fmt = fmt
        if self.writer.failure is not None:
            # Fail closed: a call that cannot be recorded is not forwarded.
            body = call.fmt.error_body(
                503, "server_error", "ledger_unavailable", "the gateway cannot write its ledger"
            )
            await send_bytes(send, 503, body, [JSON_TYPE, NO_RETRY])
            return
        try:
            try:
                if fmt is not None and method == "POST":
                    await self._format_call(call, fmt, scope, receive, send)
                elif path == MODELS_PATH and method == "GET":
                    await self._models(call, scope, send)
                else:
                    await self._not_found(call, scope, send)
            except _Denial as denial:
                await self._deny(call, denial, send)
        except asyncio.CancelledError:
            # Cancelled (a server shutting down): recorded, and its reservation settled,
            # before the cancellation goes on; nothing is awaited here.
            self._record_failure(call, "gateway error: the call was cancelled")
            raise
        except Exception as exc:  # a fault of the gateway's own: still one event per call
            log.exception("gateway error on call %s", call.call_id)
            await self._failed(call, exc, send)
        finally:
            if call.admitted:  # ended without an event: give the room back
                call.admitted = False
                self.room.leave()
            if call.tracked:
                self._track(call, -1)
            if call.gated is not None:
                self.gate.leave(call.gated)

    async def _failed(self, call: _Call, exc: Exception, send: Send) -> None:
        """Record and answer a call that an unexpected error ended (``_record_failure``).

        The client gets a 500 ``gateway_error`` (not to be retried: the work may have been
        done and charged), or, once a stream has begun, an error event, and the stream
        ends.
        """
        reason = f"gateway error: {type(exc).__name__}"
        self._record_failure(call, reason)
        body = call.fmt.error_body(500, "server_error", "gateway_error", reason)
        with contextlib.suppress(Exception):  # the client may be gone, or the answer begun
            if call.responded:
                event = call.fmt.stream_error(500, "server_error", "gateway_error", reason)
                message = {"type": "http.response.body", "more_body": False}
                await send({**message, "body": event})
            else:
                headers = [JSON_TYPE, NO_RETRY]
                if call.run_id is not None:
                    headers.append((b"x-holedger-call-id", call.call_id.encode()))
                await send_bytes(send, 500, body, headers)

    def _record_failure(self, call: _Call, reason: str) -> None:
        """Record a call that ended unexpectedly, unless its event was already handed on.

        One that was forwarded is charged its whole reservation (the upstream may have done
        the work); one that holds a reservation but was not forwarded is settled at zero;
        any other is recorded as a denial, ``500 gateway_error``. A failure to record is
        logged (the call then has no event; the gateway goes on).
        """
        if call.recorded:
            return
        try:
            if call.forwarded or call.reservation_index is not None:
                self._settle(
                    call,
                    status=500,
                    usage=None if call.forwarded else ZERO,
                    response=b"",
                    model_reported=None,
                    reason=reason,
                )
            else:
                self._record(call, allowed=False, status=500, code="gateway_error", reason=reason)
        except Exception:
            log.exception("gateway error: call %s could not be recorded", call.call_id)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._router.aclose()
                if self.writer.failure is None:  # a failing writer is not waited for
                    await asyncio.to_thread(self.writer.flush, 30.0)
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ checks

    def _binding(self, scope: Scope) -> CallerBinding | None:
        server = scope.get("server")
        if server and server[1] is None:
            return self._bindings.get(str(server[0]))
        return None

    def _authenticate(self, call: _Call, scope: Scope) -> TokenClaims:
        binding = self._binding(scope)
        if binding is not None:
            call.attribute(binding)  # a refusal is recorded against the expected caller
        token = bearer_token(scope)
        if token is None:
            raise _Denial(401, "invalid_request_error", "missing_token", "no bearer token")
        claims = self.tokens.lookup(token)
        if claims is None:
            raise _Denial(401, "invalid_request_error", "invalid_token", "unknown token")
        if claims.run_closed or not self.gate.enter(claims.run_id):
            call.run_id = None  # nothing more is recorded in a closed run
            raise _closed(claims.run_id)
        call.gated = claims.run_id
        state = claims.state()
        code = None
        if state != "live":
            code = f"token_{state}"
        elif binding is not None and claims.run_id != binding.run_id:
            code = "token_wrong_run"
        elif binding is not None and claims.scope != binding.scope:
            code = "token_wrong_scope"
        elif binding is not None and claims.trial_id != binding.trial_id:
            code = "token_wrong_trial"
        if code is not None:
            call.presented = PresentedToken(
                run_id=claims.run_id, scope=claims.scope, trial_id=claims.trial_id, state=state
            )
            if binding is None:
                # No listener names the caller: record on the token's run, no trial.
                call.run_id, call.scope = claims.run_id, claims.scope
            extra = [claims.run_id] if claims.run_id != call.run_id else []
            raise _Denial(
                403,
                "permission_error",
                code,
                f"token refused ({code.removeprefix('token_').replace('_', ' ')})",
                safety="foreign_token",
                extra_runs=extra,
            )
        call.attribute(claims)
        try:
            self._run_state(claims.run_id)
        except _Denial:
            call.run_id = None  # never write events for a run the ledger does not hold
            raise
        return claims

    def _run_state(self, run_id: str) -> _RunState:
        state = self._runs.get(run_id)
        if state is not None:
            return state
        with self._runs_lock:
            state = self._runs.get(run_id)
            if state is None:
                state = self._load_run(run_id)
                self._runs[run_id] = state
        return state

    def _load_run(self, run_id: str) -> _RunState:
        """Terms from RunOpened; settled totals from the GatewayCalls already recorded."""
        try:
            opened = self.ledger.run_terms(run_id)
        except NotFoundError as exc:
            raise _Denial(
                403, "permission_error", "unknown_run", "the token's run does not exist"
            ) from exc
        budget = opened.terms.budget
        run_budget = RunBudget(cap=budget.target_tokens, trial_cap=budget.per_trial_tokens)
        optimizer = OptimizerBudget(optimizer_cap(budget))
        with self._tally_cond:
            for rec in self.ledger.records(run_id):
                if rec.type != "GatewayCall":
                    continue
                payload = rec.typed_payload()
                assert isinstance(payload, GatewayCall)
                if payload.reservation_index is not None:
                    run_budget.restore(payload.trial_id, payload.tokens.total)
                elif payload.scope == "optimizer":
                    optimizer.restore(payload.tokens.total)
                if payload.trial_id is not None:
                    tally = self._tallies.setdefault((run_id, payload.trial_id), _Tally())
                    tally.calls += 1
                    tally.tokens = add_usage(tally.tokens, payload.tokens)
                    tally.count_failure(payload.status, payload.code, payload.reason)
        return _RunState(
            frozenset(opened.terms.models),
            run_budget,
            frozenset(getattr(opened.terms, "server_tools", None) or ()),
            optimizer,
        )

    def _allowed_models(self, claims: TokenClaims) -> frozenset[str]:
        run = self._run_state(claims.run_id)
        if claims.scope == "optimizer" and self.config.optimizer_models is not None:
            return frozenset(self.config.optimizer_models)
        return run.models

    async def _read_body(self, call: _Call, scope: Scope, receive: Receive) -> bytes:
        cap = self.config.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            raise _Denial(413, "invalid_request_error", "body_too_large", f"body over {cap} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Denial(400, "invalid_request_error", "client_gone", "client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                raise _Denial(
                    413, "invalid_request_error", "body_too_large", f"body over {cap} bytes"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    # ------------------------------------------------------------------ endpoints

    async def _not_found(self, call: _Call, scope: Scope, send: Send) -> None:
        try:
            self._authenticate(call, scope)
        except _Denial:
            if call.run_id is None or call.presented is not None:
                call.run_id = None  # only a call the token vouches for is recorded here
        raise _Denial(
            404,
            "invalid_request_error",
            "unknown_endpoint",
            f"no endpoint {scope['method']} {scope['path']}",
        )

    async def _models(self, call: _Call, scope: Scope, send: Send) -> None:
        claims = self._authenticate(call, scope)
        models = sorted(self._allowed_models(claims))
        body = json.dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "holedger"}
                    for m in models
                ],
            }
        ).encode()
        self._record(call, allowed=True, status=200, response=body)
        await send_bytes(
            send, 200, body, [JSON_TYPE, (b"x-holedger-call-id", call.call_id.encode())]
        )

    async def _format_call(
        self, call: _Call, fmt: WireFormat, scope: Scope, receive: Receive, send: Send
    ) -> None:
        claims = self._authenticate(call, scope)
        # In flight from here, so close_trial waits for this call (and counts it) even
        # while its body is still arriving; and the token is checked again once the body
        # is in, so a call begun before its trial ended is not forwarded after it.
        self._track(call, +1)
        call.tracked = True
        raw = await self._read_body(call, scope, receive)
        call.request_bytes = raw
        self._still_live(call, scope)
        body = fmt.parse(raw, self._tools_allowed(claims))
        call.stream = fmt.streams(body)
        call.model_requested = body["model"]
        if body["model"] not in self._allowed_models(claims):
            raise _Denial(
                403,
                "permission_error",
                "model_not_allowed",
                f"model {body['model']!r} is not in this run's allow-list",
                param="model",
                safety="model_not_allowed",
            )
        call.model_served = self.config.aliases.get(body["model"], body["model"])
        route = self._router.route(call.model_served, fmt)
        rewritten = fmt.rewrite(body, call.model_served, self._limits)
        call.max_tokens_imposed = rewritten.max_tokens_imposed
        forwarded = rewritten.body
        headers = fmt.upstream_headers(dict(scope.get("headers", ())))
        # Every refusal the request itself earns is decided above; only a call that would
        # be forwarded waits for room.
        await self._admit(call, scope, receive)
        if fmt.metered:
            prompt = fmt.prompt_bound(len(forwarded), body, self._limits)
            self._reserve(call, claims, prompt, rewritten.choices, rewritten.output_limit)
        post = route.poster(fmt, headers)
        if call.stream:
            await self._forward_stream(call, post, forwarded, body, receive, send)
        else:
            await self._forward(call, post, forwarded, send)

    def _tools_allowed(self, claims: TokenClaims) -> frozenset[str]:
        """Server-side tools (run by the provider) a call of this run may name."""
        return self._run_state(claims.run_id).server_tools

    async def _admit(self, call: _Call, scope: Scope, receive: Receive) -> None:
        """Take room for this call's event before anything is forwarded (EventRoom).

        While the writer is behind, the call waits here: it is already in flight, so
        ``close_trial`` counts it (and ends its wait), and its token is checked again
        after the wait. A client that leaves meanwhile, a writer that fails, or
        HOLD_TIMEOUT_S of waiting ends the call unforwarded (each recorded as a denial).
        """
        if self.room.try_admit():
            call.admitted = True
            return
        tag = (call.run_id, call.trial_id)
        waiting = asyncio.ensure_future(self.room.admit(HOLD_TIMEOUT_S, tag))
        gone: asyncio.Future[Message] = asyncio.ensure_future(receive())
        try:
            # Let the waiter register (a task's first step runs before this one resumes),
            # then look at the token again: a close_trial that revoked it just before
            # found no waiter to withdraw.
            await asyncio.sleep(0)
            self._still_live(call, scope)
            while True:
                either: set[asyncio.Future[Any]] = {waiting, gone}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    break
                if gone.result().get("type") == "http.disconnect":
                    raise _Denial(
                        400, "invalid_request_error", "client_gone", "client disconnected"
                    )
                gone = asyncio.ensure_future(receive())  # not a disconnect: keep listening
        finally:
            if not gone.done():
                gone.cancel()  # nothing is lost: a pending receive gives up no message
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
            if waiting.done() and not waiting.cancelled() and waiting.result() is None:
                call.admitted = True  # released below by _record, or by __call__
        why = waiting.result()
        # However the wait ended, granted or not: a trial that ended meanwhile
        # (close_trial withdraws its waiters) has its own call refused as such, finally.
        self._still_live(call, scope)
        if why == "failed":
            raise _Denial(
                503, "server_error", "ledger_unavailable", "the gateway cannot write its ledger"
            )
        if why in ("timeout", "withdrawn"):
            raise _Denial(
                503,
                "server_error",
                "ledger_behind",
                f"{self.room.limit} forwarded calls have events not yet written "
                f"(event_backlog); waited {HOLD_TIMEOUT_S:g} s for one of them",
                retry=True,
            )

    def _unrecord(self, call: _Call) -> None:
        """Record nothing of ``call`` (its run has closed), and stop counting it."""
        if call.tracked:
            call.tracked = False
            self._track(call, -1)
        call.run_id = None

    def _still_live(self, call: _Call, scope: Scope) -> None:
        token = bearer_token(scope)
        claims = self.tokens.lookup(token) if token is not None else None
        if claims is not None and (claims.run_closed or self.gate.is_closed(claims.run_id)):
            self._unrecord(call)
            raise _closed(claims.run_id)
        state = claims.state() if claims is not None else "revoked"
        if state != "live":
            raise _Denial(
                403, "permission_error", f"token_{state}", f"token refused ({state} meanwhile)"
            )

    def _reserve(
        self, call: _Call, claims: TokenClaims, prompt: int, choices: int, max_tokens: int
    ) -> None:
        call.prompt_bound = prompt
        # Within the exact JSON range by the request and setting bounds (gateway.limits).
        call.reserved = exact_count(prompt + choices * max_tokens, "reservation")
        limit = call.fmt.limit_field
        if claims.scope != "target":  # metered and capped by a cap of its own
            run = self._run_state(claims.run_id)
            left = run.optimizer.reserve(call.call_id, call.reserved)
            if left is not None:
                message = optimizer_refusal(
                    call.reserved, prompt, limit, max_tokens, left, run.optimizer
                )
                raise _Denial(402, "insufficient_quota", "budget_exhausted", message)
            return
        budget = self._run_state(claims.run_id).budget
        denial: list[_Denial] = []

        def on_denied(state: GatewayBudgetState, which: str) -> None:
            call.budget = state
            cap, left = (
                (state.cap, state.cap - state.settled - state.outstanding)
                if which == "run"
                else (
                    state.trial_cap or 0,
                    (state.trial_cap or 0) - state.trial_settled - state.trial_outstanding,
                )
            )
            denial.append(
                _Denial(
                    402,
                    "insufficient_quota",
                    "budget_exhausted",
                    f"{which} token budget: this call reserves {call.reserved} tokens "
                    f"(prompt bound {prompt} + {limit} {max_tokens}), {max(left, 0)} of "
                    f"{cap} remain; lower {limit} or stop",
                )
            )
            d = denial[0]
            self._record(call, allowed=False, status=d.status, code=d.code, reason=d.message)

        state, index = budget.reserve(call.call_id, call.trial_id, call.reserved, on_denied)
        if index is None:
            denial[0].recorded = True
            raise denial[0]
        call.budget = state
        call.reservation_index = index

    def _settle(
        self,
        call: _Call,
        *,
        status: int,
        usage: TokenUsage | None,
        response: bytes,
        model_reported: str | None,
        reason: str | None = None,
    ) -> None:
        """Charge the call: ``usage`` as reported, or (None) its whole reservation."""
        estimated = usage is None
        if usage is None:
            output = call.reserved - call.prompt_bound
            usage = TokenUsage(
                input=call.prompt_bound, output=output, total=call.prompt_bound + output
            )

        def on_settled() -> None:
            self._record(
                call,
                allowed=True,
                status=status,
                tokens=usage,
                response=response,
                usage_estimated=estimated,
                model_reported=model_reported,
                reason=reason,
            )

        if call.reservation_index is not None:
            budget = self._run_state(str(call.run_id)).budget
            budget.settle(call.call_id, usage.total, on_settled)
        else:
            on_settled()
            if call.scope == "optimizer" and call.run_id is not None:
                self._run_state(call.run_id).optimizer.settle(call.call_id, usage.total)

    # ------------------------------------------------------------------ forwarding

    async def _forward(self, call: _Call, post: Poster, forwarded: bytes, send: Send) -> None:
        call.forwarded = True
        try:
            resp = await post(forwarded)
        except UpstreamError as exc:
            await self._upstream_failed(call, exc, send)
            return
        try:
            data = await resp.aread()
        except UpstreamError as exc:
            await self._upstream_failed(call, exc, send)
            return
        finally:
            await resp.aclose()
        usage: TokenUsage | None = ZERO  # a complete error answer consumed nothing
        model = None
        if resp.status_code < 400:
            try:
                obj = json.loads(data)
                usage = call.fmt.usage(obj)
                model = obj.get("model") if isinstance(obj.get("model"), str) else None
            except UsageError as exc:
                await self._bad_usage(call, str(exc), send)
                return
            except (ValueError, AttributeError):
                usage = None
        self._settle(
            call,
            status=resp.status_code,
            usage=usage,
            response=data,
            model_reported=model,
            reason=None if resp.status_code < 400 else "upstream error",
        )
        headers = [
            (b"content-type", resp.headers.get("content-type", "application/json").encode()),
            (b"x-holedger-call-id", call.call_id.encode()),
            *_retry_headers(resp.headers),
        ]
        await send_bytes(send, resp.status_code, data, headers)

    async def _bad_usage(self, call: _Call, detail: str, send: Send) -> None:
        """An answer whose usage cannot be believed: charged its whole reservation, and
        not passed on (the client gets an error in its format's shape)."""
        reason = f"upstream usage does not add up: {detail}"
        self._settle(call, status=502, usage=None, response=b"", model_reported=None, reason=reason)
        body = call.fmt.error_body(502, "upstream_error", "upstream_bad_usage", reason)
        await send_bytes(
            send, 502, body, [JSON_TYPE, NO_RETRY, (b"x-holedger-call-id", call.call_id.encode())]
        )

    async def _upstream_failed(self, call: _Call, exc: UpstreamError, send: Send) -> None:
        # The upstream may have done the work before the connection broke: charge the
        # reservation, unless the request never left (connect failure).
        reason = f"upstream unreachable: {exc.kind}"
        self._settle(
            call,
            status=502,
            usage=None if exc.sent else ZERO,
            response=b"",
            model_reported=None,
            reason=reason,
        )
        body = call.fmt.error_body(502, "upstream_error", "upstream_unreachable", reason)
        await send_bytes(
            send, 502, body, [JSON_TYPE, NO_RETRY, (b"x-holedger-call-id", call.call_id.encode())]
        )

    async def _forward_stream(
        self,
        call: _Call,
        post: Poster,
        forwarded: bytes,
        body: dict[str, Any],
        receive: Receive,
        send: Send,
    ) -> None:
        call.forwarded = True
        try:
            resp = await post(forwarded)
        except UpstreamError as exc:
            await self._upstream_failed(call, exc, send)
            return
        if resp.status_code >= 400:
            try:
                data = await resp.aread()
            except UpstreamError as exc:
                await self._upstream_failed(call, exc, send)
                return
            finally:
                await resp.aclose()
            self._settle(
                call,
                status=resp.status_code,
                usage=ZERO,
                response=data,
                model_reported=None,
                reason="upstream error",
            )
            headers = [
                JSON_TYPE,
                (b"x-holedger-call-id", call.call_id.encode()),
                *_retry_headers(resp.headers),
            ]
            await send_bytes(send, resp.status_code, data, headers)
            return
        pump = call.fmt.pump(body, self.config.blob_cap_bytes)
        finished = False
        client_gone = False
        settled = False

        def settle_once() -> None:
            # Settle before the last byte goes out: once the client has its answer, the
            # trial may end and read its totals.
            nonlocal settled
            if settled:
                return
            settled = True
            reason = None
            if pump.usage is None:
                if client_gone:
                    reason = "client disconnected before the usage chunk"
                elif pump.cut is not None:
                    reason = pump.cut
                else:
                    reason = "upstream sent no usage chunk"
            self._settle(
                call,
                status=200,
                usage=pump.usage,
                response=pump.sent,
                model_reported=pump.model,
                reason=reason,
            )

        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            # The client leaving mid-stream stops the forwarding (it is charged below).
            nonlocal client_gone
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    if not finished:
                        client_gone = True
                        task.cancel()
                    return

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        SSE_TYPE,
                        (b"cache-control", b"no-cache"),
                        (b"x-holedger-call-id", call.call_id.encode()),
                    ],
                }
            )
            call.responded = True
            try:
                async for chunk in resp.aiter_raw():
                    out = pump.feed(chunk)
                    if pump.done or pump.broken:
                        settle_once()  # a client stops reading at its stream's last event
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    if pump.broken:
                        break
                tail = pump.finish()
                if pump.broken:
                    tail += pump.error_event(pump.broken, "upstream_bad_stream")
            except UpstreamError as exc:
                pump.cut = f"upstream stream broke: {exc.kind}"
                tail = pump.finish() + pump.error_event(pump.cut)
            finished = True
            settle_once()
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        except asyncio.CancelledError:
            if not client_gone:
                raise
            task.uncancel()  # our own cancellation: the client left
        except Exception as exc:
            pump.cut = pump.cut or f"gateway error: {type(exc).__name__}"  # settled below
            raise
        finally:
            watcher.cancel()
            await resp.aclose()
            settle_once()

    # ------------------------------------------------------------------ recording

    def _track(self, call: _Call, delta: int) -> None:
        if call.run_id is None or call.trial_id is None:
            return
        with self._tally_cond:
            tally = self._tallies.setdefault((call.run_id, call.trial_id), _Tally())
            tally.in_flight += delta
            if tally.in_flight == 0:
                self._tally_cond.notify_all()

    async def _deny(self, call: _Call, denial: _Denial, send: Send) -> None:
        if not denial.recorded:
            self._record(
                call,
                allowed=False,
                status=denial.status,
                code=denial.code,
                reason=denial.message,
                safety=denial.safety,
                extra_runs=denial.extra_runs,
            )
        headers = [JSON_TYPE] if denial.retry else [JSON_TYPE, NO_RETRY]
        if call.run_id is not None:
            headers.append((b"x-holedger-call-id", call.call_id.encode()))
        body = call.fmt.error_body(
            denial.status, denial.err_type, denial.code, denial.message, denial.param
        )
        await send_bytes(send, denial.status, body, headers)

    def _record(
        self,
        call: _Call,
        *,
        allowed: bool,
        status: int,
        code: str | None = None,
        reason: str | None = None,
        tokens: TokenUsage = ZERO,
        response: bytes = b"",
        usage_estimated: bool = False,
        model_reported: str | None = None,
        safety: str | None = None,
        extra_runs: list[str] | None = None,
    ) -> None:
        if call.run_id is None:
            return
        # The event is built, digested and signed on the writer thread: only a snapshot
        # is taken here, in decision order.
        # Only what the blobs keep (the first blob_cap bytes) stays in memory until written.
        cap = self.config.blob_cap_bytes
        snapshot = copy.copy(call)
        snapshot.request_bytes = call.request_bytes[:cap]
        outcome = _Outcome(
            call=snapshot,
            allowed=allowed,
            status=status,
            code=code,
            reason=reason,
            tokens=tokens,
            response=response[:cap],
            usage_estimated=usage_estimated,
            model_reported=model_reported,
            safety=safety,
            latency_ms=int((time.perf_counter() - call.t0) * 1000),
        )
        item = Submission(call.run_id, build=outcome.events, fallback=partial(refused, snapshot))
        # Handing the event to the writer is the commit point: the flags say so first, so
        # a fault after it can never record the call twice or give its room back twice.
        admitted, call.admitted, call.recorded = call.admitted, False, True
        self.room.submit(item, admitted=admitted, forwarded=allowed)
        try:  # past the commit point nothing may raise: the caller settles as recorded
            for other in extra_runs or []:
                self.writer.submit(Submission(other, build=outcome.violation))
            if call.trial_id is not None:
                with self._tally_cond:
                    tally = self._tallies.setdefault((call.run_id, call.trial_id), _Tally())
                    tally.calls += 1
                    tally.tokens = add_usage(tally.tokens, tokens)
                    tally.count_failure(status, code, reason)
        except Exception:
            log.exception("gateway error after recording call %s", call.call_id)


@dataclass(frozen=True)
class _Outcome:
    """How one call ended; becomes its GatewayCall (and SafetyViolation) on the writer."""

    call: _Call
    allowed: bool
    status: int
    code: str | None
    reason: str | None
    tokens: TokenUsage
    response: bytes
    usage_estimated: bool
    model_reported: str | None
    safety: str | None
    latency_ms: int

    def events(self) -> tuple[list[tuple[str, BaseModel, Role]], list[bytes]]:
        # The bodies were cut to blob_cap_bytes when the snapshot was taken (_record).
        call = self.call
        blobs: list[bytes] = []
        req_digest = resp_digest = None
        if call.request_bytes:
            blobs.append(call.request_bytes)
            req_digest = hashlib.sha256(call.request_bytes).hexdigest()
        if self.response:
            blobs.append(self.response)
            resp_digest = hashlib.sha256(self.response).hexdigest()
        event = GatewayCall(
            call_id=call.call_id,
            scope=call.scope,
            request_id=call.request_id,
            trial_id=call.trial_id,
            case_id=call.case_id,
            attempt=call.attempt,
            model_requested=_text(call.model_requested),
            model_served=_text(call.model_served) if self.allowed else None,
            allowed=self.allowed,
            reason=_text(self.reason),
            status=self.status,
            stream=call.stream,
            tokens=self.tokens,
            reserved=call.reserved,
            max_tokens_imposed=call.max_tokens_imposed,
            usage_estimated=self.usage_estimated,
            latency_ms=self.latency_ms,
            request_digest=req_digest,
            response_digest=resp_digest,
            endpoint=_text(call.endpoint),
            code=self.code,
            model_reported=_text(self.model_reported),
            reservation_index=call.reservation_index,
            budget=call.budget,
            presented=call.presented,
            format=call.fmt.name if call.endpoint == call.fmt.path else None,
        )
        events: list[tuple[str, BaseModel, Role]] = [("GatewayCall", event, "gateway")]
        if self.safety is not None:
            violation, more = self.violation()
            events += violation
            blobs += more
        return events, blobs

    def violation(self) -> tuple[list[tuple[str, BaseModel, Role]], list[bytes]]:
        """The SafetyViolation and its evidence blob (also recorded on other runs)."""
        call = self.call
        assert self.safety is not None
        evidence = canonical_json(
            {
                "call_id": call.call_id,
                "code": self.code,
                "model_requested": _text(call.model_requested),
                "presented": call.presented.model_dump(mode="json") if call.presented else None,
                "run_id": call.run_id,
                "trial_id": call.trial_id,
            }
        )
        violation = SafetyViolation(
            category=self.safety,
            trial_id=call.trial_id,
            call_id=call.call_id,
            detail=escape_text(_text(self.reason) or self.safety),
            evidence_digest=hashlib.sha256(evidence).hexdigest(),
        )
        return [("SafetyViolation", violation, "gateway")], [evidence]


def _text(value: str | None) -> str | None:
    """``value`` as event text: a lone surrogate (from an upstream's answer or an error
    message) is written as its backslash escape, so the event can still be signed."""
    if value is None or has_utf8_form(value):
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _closed(run_id: str) -> _Denial:
    """The refusal of a call of a closed run (recorded nowhere: the run takes no events)."""
    return _Denial(403, "permission_error", RUN_CLOSED_CODE, run_closed_message(run_id))


def create_gateway_app(
    ledger: Ledger,
    tokens: TokenRegistry | None = None,
    config: GatewayConfig | None = None,
    *,
    upstream_app: ASGIApp | None = None,
) -> Gateway:
    """The gateway ASGI app (tokens default to a registry in the ledger's database)."""
    registry = tokens or TokenRegistry(ledger.app.engine)
    return Gateway(ledger, registry, config, upstream_app=upstream_app)


__all__ = ["CallerBinding", "Gateway", "TrialUsage", "create_gateway_app"]


RETRY_HEADERS = ("retry-after-ms", "retry-after", "x-should-retry")


def _retry_headers(upstream: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The upstream's retry advice, passed on so a client's SDK backs off as told."""
    return [
        (name.encode(), str(upstream[name]).encode()) for name in RETRY_HEADERS if name in upstream
    ]
