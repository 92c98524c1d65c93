"""The HTTP face of the offline simulator: an OpenAI-compatible and Anthropic upstream.

``POST /v1/chat/completions`` (plain, or SSE when ``stream`` is true, with the usage chunk
when ``stream_options.include_usage`` is set), ``POST /v1/responses`` and
``POST /v1/messages`` (plain and SSE), ``POST /v1/messages/count_tokens``,
``POST /v1/embeddings`` and ``GET /v1/models``, all built on
:meth:`SimulatedModel.complete` (``sim_formats`` translates): a stream is the complete
answer cut into its format's events. Errors come in each format's own shape.
Run it with ``holedger sim serve --port P`` or use :func:`create_simulator_app` in-process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from holedger.gateway import sim_formats
from holedger.gateway.formats import CHAT, FORMATS
from holedger.gateway.simulator import (
    TRANSIENT_ERROR_RATE,
    TRANSIENT_STATUSES,
    SimulatedModel,
    SimulatorTransientError,
    _Draws,
)
from holedger.gateway.wire import JSON_TYPE, SSE_TYPE, Receive, Scope, Send, error_body, send_bytes

CHUNK_CHARS = 16


class SimulatorApp:
    """ASGI app serving one :class:`SimulatedModel`; ``chunk_delay_s`` slows streams and
    ``latency_s`` delays every answer (a model's time to its first token)."""

    def __init__(
        self, model: SimulatedModel, *, chunk_delay_s: float = 0.0, latency_s: float = 0.0
    ) -> None:
        self.model = model
        self.chunk_delay_s = chunk_delay_s
        self.latency_s = latency_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/v1/models" and method == "GET":
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "holedger-simulator"}
                for m in self.model.models()
            ]
            body = json.dumps({"object": "list", "data": data}).encode()
            await send_bytes(send, 200, body, [JSON_TYPE])
            return
        fmt = FORMATS.get(path)
        if fmt is None or method != "POST":
            msg = f"no endpoint {method} {path}"
            await send_bytes(send, 404, error_body(msg, "invalid_request_error", None), [JSON_TYPE])
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("body is not a JSON object")
            result = self._answer(fmt.name, request)
        except SimulatorTransientError as exc:
            body = fmt.error_body(exc.status, "server_error", "simulated_transient", str(exc))
            # Like a provider under load: retry soon (the SDKs honour this header).
            await send_bytes(send, exc.status, body, [JSON_TYPE, (b"retry-after-ms", b"20")])
            return
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            body = fmt.error_body(400, "invalid_request_error", None, str(exc))
            await send_bytes(send, 400, body, [JSON_TYPE])
            return
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if request.get("stream") and fmt is CHAT:
            await self._stream(request, result, send)
        elif request.get("stream") and fmt.name == "responses":
            await self._events(sim_formats.response_events(result), send)
        elif request.get("stream") and fmt.name == "messages":
            await self._events(sim_formats.message_events(result), send)
        else:
            await send_bytes(send, 200, json.dumps(result).encode(), [JSON_TYPE])

    def _answer(self, name: str, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request in format ``name`` (an answer object, not a stream)."""
        model = self.model
        if name == "responses":
            chat = sim_formats.responses_to_chat(request)
            return sim_formats.chat_to_response(model.complete(chat), request)
        if name == "messages":
            chat = sim_formats.messages_to_chat(request)
            return sim_formats.chat_to_message(model.complete(chat), request)
        if name == "count_tokens":
            return sim_formats.count_message_tokens(model, request)
        if name == "embeddings":
            self._maybe_fail(request)
            return sim_formats.embed(model.seed, model.model_name, request)
        return model.complete(request)

    def _maybe_fail(self, request: dict[str, Any]) -> None:
        """The transient failures chat completions meet, drawn the same way."""
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        draws = _Draws(self.model.seed, f"{digest}:{self.model._occurrence(digest)}")
        if draws.uniform("transient") < TRANSIENT_ERROR_RATE:
            status = TRANSIENT_STATUSES[draws.choice("status", len(TRANSIENT_STATUSES))]
            raise SimulatorTransientError(status, f"simulated upstream error {status}")

    async def _events(self, events: list[tuple[str, dict[str, Any]]], send: Send) -> None:
        """Named SSE events (the Responses and Messages streams), then the end."""
        await send({"type": "http.response.start", "status": 200, "headers": [SSE_TYPE]})
        for name, data in events:
            text = json.dumps(data, separators=(",", ":"))
            chunk = f"event: {name}\ndata: {text}\n\n".encode()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, request: dict[str, Any], result: dict[str, Any], send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [SSE_TYPE]})
        options = request.get("stream_options")
        with_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        for chunk in stream_chunks(result, with_usage):
            data = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def stream_chunks(result: dict[str, Any], with_usage: bool) -> list[dict[str, Any]]:
    """A complete chat.completion cut into chat.completion.chunk objects."""
    base = {
        "id": result.get("id"),
        "object": "chat.completion.chunk",
        "created": result.get("created", 0),
        "model": result.get("model"),
    }
    extra = {"usage": None} if with_usage else {}
    chunks: list[dict[str, Any]] = []
    for choice in result.get("choices", []):
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        first: dict[str, Any] = {"role": message.get("role", "assistant"), "content": ""}
        chunks.append({**base, "choices": [_choice(index, first, None)], **extra})
        content = message.get("content") or ""
        for start in range(0, len(content), CHUNK_CHARS):
            delta = {"content": content[start : start + CHUNK_CHARS]}
            chunks.append({**base, "choices": [_choice(index, delta, None)], **extra})
        calls = message.get("tool_calls")
        if calls:
            deltas = [{"index": i, **call} for i, call in enumerate(calls)]
            tool_delta = {"tool_calls": deltas}
            chunks.append({**base, "choices": [_choice(index, tool_delta, None)], **extra})
        last = _choice(index, {}, choice.get("finish_reason", "stop"))
        chunks.append({**base, "choices": [last], **extra})
    if with_usage:
        chunks.append({**base, "choices": [], "usage": result.get("usage")})
    return chunks


def _choice(index: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


def create_simulator_app(
    seed: int = 0,
    *,
    model: SimulatedModel | None = None,
    chunk_delay_s: float = 0.0,
    latency_s: float = 0.0,
) -> SimulatorApp:
    return SimulatorApp(
        model or SimulatedModel(seed=seed), chunk_delay_s=chunk_delay_s, latency_s=latency_s
    )
