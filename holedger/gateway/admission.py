"""Admission: who is calling, whether the request may be forwarded, and room for its event.

Checked in this order, the first failing check refusing the call (a :class:`Denial`,
answered in the call's format's error shape): the token (present, known, live, issued
for the caller the listener expects); the body (size; the format's own checks follow in
the dispatcher); and, for a call that would be forwarded, room in the EventRoom, waited
for while the event writer is behind. The token is looked at again after every wait, so
a call begun before its trial ended is not forwarded after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from holedger.gateway.call import Call, CallerBinding
from holedger.gateway.call_events import CallRecorder
from holedger.gateway.closing import RUN_CLOSED_CODE, RunGate, run_closed_message
from holedger.gateway.config import GatewayConfig
from holedger.gateway.denial import Denial
from holedger.gateway.metering import Metering
from holedger.gateway.recorder import EventRoom
from holedger.gateway.tokens import TokenClaims, TokenRegistry
from holedger.gateway.wire import Message, Receive, Scope, bearer_token
from holedger.schemas.events import PresentedToken

# How long a call waits for room while the event writer is behind (then 503 ledger_behind).
HOLD_TIMEOUT_S = 30.0


def closed(run_id: str) -> Denial:
    """The refusal of a call of a closed run (recorded nowhere: the run takes no events)."""
    return Denial(403, "permission_error", RUN_CLOSED_CODE, run_closed_message(run_id))


class Admission:
    """The checks before a call is forwarded (tokens, listeners, body size, room)."""

    def __init__(
        self,
        tokens: TokenRegistry,
        config: GatewayConfig,
        gate: RunGate,
        room: EventRoom,
        metering: Metering,
        recorder: CallRecorder,
    ) -> None:
        self.tokens = tokens
        self.config = config
        self.gate = gate
        self.room = room
        self.metering = metering
        self.recorder = recorder
        self._bindings: dict[str, CallerBinding] = {}

    def bind(self, listener: str, binding: CallerBinding) -> None:
        self._bindings[listener] = binding

    def unbind(self, listener: str) -> None:
        self._bindings.pop(listener, None)

    def _binding(self, scope: Scope) -> CallerBinding | None:
        server = scope.get("server")
        if server and server[1] is None:
            return self._bindings.get(str(server[0]))
        return None

    def authenticate(self, call: Call, scope: Scope) -> TokenClaims:
        """The caller's claims, with ``call`` attributed to them; a Denial otherwise."""
        binding = self._binding(scope)
        if binding is not None:
            call.attribute(binding)  # a refusal is recorded against the expected caller
        token = bearer_token(scope)
        if token is None:
            raise Denial(401, "invalid_request_error", "missing_token", "no bearer token")
        claims = self.tokens.lookup(token)
        if claims is None:
            raise Denial(401, "invalid_request_error", "invalid_token", "unknown token")
        if claims.run_closed or not self.gate.enter(claims.run_id):
            call.run_id = None  # nothing more is recorded in a closed run
            raise closed(claims.run_id)
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
            raise Denial(
                403,
                "permission_error",
                code,
                f"token refused ({code.removeprefix('token_').replace('_', ' ')})",
                safety="foreign_token",
                extra_runs=extra,
            )
        call.attribute(claims)
        try:
            self.metering.run_state(claims.run_id)
        except Denial:
            call.run_id = None  # never write events for a run the ledger does not hold
            raise
        return claims

    def allowed_models(self, claims: TokenClaims) -> frozenset[str]:
        run = self.metering.run_state(claims.run_id)
        if claims.scope == "optimizer" and self.config.optimizer_models is not None:
            return frozenset(self.config.optimizer_models)
        return run.models

    def tools_allowed(self, claims: TokenClaims) -> frozenset[str]:
        """Server-side tools (run by the provider) a call of this run may name."""
        return self.metering.run_state(claims.run_id).server_tools

    def track(self, call: Call) -> None:
        """Count ``call`` in flight (close_trial waits for it, and counts it)."""
        self.recorder.track(call, +1)
        call.tracked = True

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        cap = self.config.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            raise Denial(413, "invalid_request_error", "body_too_large", f"body over {cap} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Denial(400, "invalid_request_error", "client_gone", "client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                raise Denial(
                    413, "invalid_request_error", "body_too_large", f"body over {cap} bytes"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def admit(self, call: Call, scope: Scope, receive: Receive) -> None:
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
            self.still_live(call, scope)
            while True:
                either: set[asyncio.Future[Any]] = {waiting, gone}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    break
                if gone.result().get("type") == "http.disconnect":
                    raise Denial(400, "invalid_request_error", "client_gone", "client disconnected")
                gone = asyncio.ensure_future(receive())  # not a disconnect: keep listening
        finally:
            if not gone.done():
                gone.cancel()  # nothing is lost: a pending receive gives up no message
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
            if waiting.done() and not waiting.cancelled() and waiting.result() is None:
                call.admitted = True  # released by the recorder, or by the dispatcher
        why = waiting.result()
        # However the wait ended, granted or not: a trial that ended meanwhile
        # (close_trial withdraws its waiters) has its own call refused as such, finally.
        self.still_live(call, scope)
        if why == "failed":
            raise Denial(
                503, "server_error", "ledger_unavailable", "the gateway cannot write its ledger"
            )
        if why in ("timeout", "withdrawn"):
            raise Denial(
                503,
                "server_error",
                "ledger_behind",
                f"{self.room.limit} forwarded calls have events not yet written "
                f"(event_backlog); waited {HOLD_TIMEOUT_S:g} s for one of them",
                retry=True,
            )

    def _unrecord(self, call: Call) -> None:
        """Record nothing of ``call`` (its run has closed), and stop counting it."""
        if call.tracked:
            call.tracked = False
            self.recorder.track(call, -1)
        call.run_id = None

    def still_live(self, call: Call, scope: Scope) -> None:
        """Refuse ``call`` if its token died (or its run closed) since it was checked."""
        token = bearer_token(scope)
        claims = self.tokens.lookup(token) if token is not None else None
        if claims is not None and (claims.run_closed or self.gate.is_closed(claims.run_id)):
            self._unrecord(call)
            raise closed(claims.run_id)
        state = claims.state() if claims is not None else "revoked"
        if state != "live":
            raise Denial(
                403, "permission_error", f"token_{state}", f"token refused ({state} meanwhile)"
            )


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
