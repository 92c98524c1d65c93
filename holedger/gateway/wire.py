"""OpenAI wire details the gateway needs: error bodies, SSE events, small ASGI helpers."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The openai SDK retries 408, 409, 429 and 5xx unless told not to; denials are final.
NO_RETRY = (b"x-should-retry", b"false")
JSON_TYPE = (b"content-type", b"application/json")
SSE_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")


def error_body(message: str, err_type: str, code: str | None, param: str | None = None) -> bytes:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return json.dumps(body, separators=(",", ":")).encode()


async def send_bytes(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def bearer_token(scope: Scope) -> str | None:
    """The token from ``Authorization: Bearer`` (or ``x-api-key``), or None."""
    raw = header(scope, b"authorization")
    if raw is not None:
        text = raw.decode("latin-1").strip()
        if text[:7].lower() == "bearer ":
            return text[7:].strip() or None
        return None
    key = header(scope, b"x-api-key")
    return key.decode("latin-1").strip() or None if key is not None else None


def split_sse(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (without their blank-line terminator) and the unfinished rest."""
    if b"\r" in buffer:
        buffer = buffer.replace(b"\r\n", b"\n")
    parts = buffer.split(b"\n\n")
    return parts[:-1], parts[-1]


def sse_data(event: bytes) -> bytes | None:
    """The joined ``data:`` payload of one SSE event, or None when it has none."""
    datas = [
        line[5:].lstrip(b" ") if line.startswith(b"data:") else None for line in event.split(b"\n")
    ]
    found = [d for d in datas if d is not None]
    return b"\n".join(found) if found else None
