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

:class:`Gateway` only dispatches: the checks are ``admission``, the reservation and
settlement ``metering``, the upstream call ``forwarding`` and ``streaming``, and the
signed events ``call_events``. Every call that can be attributed to a run becomes one
signed GatewayCall event. One gateway process serves a ledger's runs (the budget state
is in its memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from holedger.gateway.admission import Admission
from holedger.gateway.call import Call, CallerBinding, CallIds, TrialUsage
from holedger.gateway.call_events import CallRecorder
from holedger.gateway.closing import CLOSE_WAIT_S, RunGate
from holedger.gateway.config import GatewayConfig
from holedger.gateway.denial import Denial
from holedger.gateway.formats import Limits, WireFormat, format_for_path
from holedger.gateway.formats.base import switch_models
from holedger.gateway.forwarding import Forwarder
from holedger.gateway.metering import Metering
from holedger.gateway.recorder import EventRoom, EventWriter
from holedger.gateway.routing import Router
from holedger.gateway.streaming import forward_stream
from holedger.gateway.tokens import TokenRegistry
from holedger.gateway.wire import JSON_TYPE, NO_RETRY, ASGIApp, Receive, Scope, Send, send_bytes
from holedger.ledger.closing import register_gateway, unregister_gateway
from holedger.ledger.store import Ledger
from holedger.schemas.events import TokenUsage

log = logging.getLogger("holedger.gateway")
MODELS_PATH = "/v1/models"


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
        self.gate = RunGate()
        self.recorder = CallRecorder(self.writer, self.room, self.config.blob_cap_bytes)
        self.metering = Metering(ledger, self.recorder)
        self.admission = Admission(
            tokens, self.config, self.gate, self.room, self.metering, self.recorder
        )
        self.forwarder = Forwarder(self.metering, self.config.blob_cap_bytes)
        self._router = Router(self.config, upstream_app)
        self._limits = Limits(
            default_max_tokens=self.config.default_max_tokens,
            max_tokens_field=self.config.max_tokens_field,
            media_part_tokens=self.config.media_part_tokens,
        )
        self._ids = CallIds()
        self.writer.on_closed = self.gate.shut  # the ledger refused a run: it has closed
        ledger.close_hooks.append(self.close_run)
        self._instance = register_gateway(ledger.app.engine)

    # ------------------------------------------------------------------ public API

    def bind(self, listener: str, binding: CallerBinding) -> None:
        """Expect only ``binding``'s token on the unix socket at path ``listener``."""
        self.admission.bind(listener, binding)

    def unbind(self, listener: str) -> None:
        self.admission.unbind(listener)

    def trial_usage(self, run_id: str, trial_id: str) -> TrialUsage:
        return self.recorder.trial_usage(run_id, trial_id)

    def close_trial(self, run_id: str, trial_id: str, *, wait_s: float = 30.0) -> TrialUsage:
        """End a trial: revoke its tokens, wait for its calls in flight, write their events,
        and return its totals (what TrialCompleted.tokens and .gateway_calls must say)."""
        self.tokens.revoke_trial(run_id, trial_id)
        self.room.withdraw((run_id, trial_id))  # its calls waiting for room end now
        self.recorder.wait_trial_idle(run_id, trial_id, wait_s)
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
        call = Call(self._ids.next(), time.perf_counter(), path)
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
                    self._not_found(call, scope)
            except Denial as denial:
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
                self.recorder.track(call, -1)
            if call.gated is not None:
                self.gate.leave(call.gated)

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

    # ------------------------------------------------------------------ endpoints

    def _not_found(self, call: Call, scope: Scope) -> None:
        try:
            self.admission.authenticate(call, scope)
        except Denial:
            if call.run_id is None or call.presented is not None:
                call.run_id = None  # only a call the token vouches for is recorded here
        raise Denial(
            404,
            "invalid_request_error",
            "unknown_endpoint",
            f"no endpoint {scope['method']} {scope['path']}",
        )

    async def _models(self, call: Call, scope: Scope, send: Send) -> None:
        claims = self.admission.authenticate(call, scope)
        models = sorted(self.admission.allowed_models(claims))
        body = json.dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "holedger"}
                    for m in models
                ],
            }
        ).encode()
        self.recorder.record(call, allowed=True, status=200, response=body)
        await send_bytes(send, 200, body, [JSON_TYPE, call.id_header()])

    async def _format_call(
        self, call: Call, fmt: WireFormat, scope: Scope, receive: Receive, send: Send
    ) -> None:
        admission = self.admission
        claims = admission.authenticate(call, scope)
        # In flight from here, so close_trial waits for this call (and counts it) even
        # while its body is still arriving; and the token is checked again once the body
        # is in, so a call begun before its trial ended is not forwarded after it.
        admission.track(call)
        raw = await admission.read_body(scope, receive)
        call.request_bytes = raw
        admission.still_live(call, scope)
        tools = admission.tools_allowed(claims)
        body = fmt.parse(raw, tools)
        call.stream = fmt.streams(body)
        call.model_requested = body["model"]
        allowed = admission.allowed_models(claims)
        for name in [body["model"], *switch_models(body)]:
            if name not in allowed:
                call.model_requested = name  # the model refused (replay checks it)
                raise Denial(
                    403,
                    "permission_error",
                    "model_not_allowed",
                    f"model {name!r} is not in this run's allow-list",
                    param="model",
                    safety="model_not_allowed",
                )
        call.model_served = self.config.aliases.get(body["model"], body["model"])
        route = self._router.route(call.model_served, fmt)
        rewritten = fmt.rewrite(body, call.model_served, self._limits)
        call.max_tokens_imposed = rewritten.max_tokens_imposed
        forwarded = rewritten.body
        headers = fmt.upstream_headers(dict(scope.get("headers", ())), tools)
        # Every refusal the request itself earns is decided above; only a call that would
        # be forwarded waits for room.
        await admission.admit(call, scope, receive)
        if fmt.metered:
            prompt = fmt.prompt_bound(len(forwarded), body, self._limits)
            self.metering.reserve(call, claims, prompt, rewritten.choices, rewritten.output_limit)
        post = route.poster(fmt, headers)
        if call.stream:
            await forward_stream(self.forwarder, call, post, forwarded, body, receive, send)
        else:
            await self.forwarder.forward(call, post, forwarded, send)

    # ------------------------------------------------------------------ endings

    async def _deny(self, call: Call, denial: Denial, send: Send) -> None:
        if not denial.recorded:
            self.recorder.record(
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
            headers.append(call.id_header())
        body = call.fmt.error_body(
            denial.status, denial.err_type, denial.code, denial.message, denial.param
        )
        await send_bytes(send, denial.status, body, headers)

    async def _failed(self, call: Call, exc: Exception, send: Send) -> None:
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
                    headers.append(call.id_header())
                await send_bytes(send, 500, body, headers)

    def _record_failure(self, call: Call, reason: str) -> None:
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
                self.metering.settle(
                    call,
                    status=500,
                    usage=None if call.forwarded else TokenUsage(),
                    response=b"",
                    model_reported=None,
                    reason=reason,
                )
            else:
                self.recorder.record(
                    call, allowed=False, status=500, code="gateway_error", reason=reason
                )
        except Exception:
            log.exception("gateway error: call %s could not be recorded", call.call_id)


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
