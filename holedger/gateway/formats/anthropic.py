"""Anthropic Messages: ``POST /v1/messages`` (plain and SSE) and
``POST /v1/messages/count_tokens``.

Reservation: prompt bound + ``max_tokens`` (required, as Anthropic requires it; extended
thinking is counted within it). Usage: ``input_tokens`` (uncached), ``cache_read_input_tokens``,
``cache_creation_input_tokens``, ``output_tokens``; recorded with input = the three input
counts together (cached = the reads, cache_write = the writes). A stream reports input in
``message_start`` and the final output in ``message_delta``; a stream that ends before its
``message_delta`` is charged its reservation.

Refused: model-switching fields; ``mcp_servers`` (remote MCP servers) and ``container``;
tools the provider runs itself (web search, web fetch, code execution, tool search)
unless the run's terms allow them. Errors are Anthropic error objects
(``{"type": "error", "error": {"type", "message"}}``) with Anthropic's error types.
"""

from __future__ import annotations

import json
import re
from typing import Any

from holedger.gateway.denial import invalid
from holedger.gateway.formats import base
from holedger.gateway.formats.anthropic_beta import refuse_betas
from holedger.gateway.formats.base import Limits, Rewritten, SsePump, UsageError, WireFormat
from holedger.gateway.limits import MAX_OUTPUT_TOKENS, Bound
from holedger.protocol import endpoints
from holedger.schemas.events import TokenUsage

DEFAULT_VERSION = "2023-06-01"
# Versioned tool types whose calls the client runs (the rest are run by Anthropic).
CLIENT_TOOL_PREFIXES = ("bash_", "text_editor_", "computer_", "memory_")
STREAM_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
# Every numeric field of a Messages request the gateway reads or forwards.
MESSAGES_BOUNDS = (
    Bound("max_tokens", 1, MAX_OUTPUT_TOKENS),
    Bound("temperature", 0, 1, whole=False),
    Bound("top_p", 0, 1, whole=False),
    Bound("top_k", 0, 2**31 - 1),
)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
_HEADER_VALUE = re.compile(rb"^[\x20-\x7e]{1,512}$")
INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def anthropic_usage(block: Any) -> TokenUsage | None:
    if not isinstance(block, dict):
        return None
    uncached = base.count(block, "input_tokens", required=True)
    write = base.count(block, "cache_creation_input_tokens")
    read = base.count(block, "cache_read_input_tokens")
    out = base.count(block, "output_tokens", required=True)
    split = base.details(block, "cache_creation")
    if split:
        parts = sum(base.count(split, key) for key in split)
        if parts != write:
            raise UsageError(
                f"usage cache_creation parts sum to {parts}, "
                f"not cache_creation_input_tokens {write}"
            )
    return base.usage_of(uncached + write + read, out, cached=read, cache_write=write)


def _tool_kind(tool: dict[str, Any]) -> str | None:
    kind = tool.get("type")
    if kind is None or kind == "custom":
        return None
    if not isinstance(kind, str):
        raise invalid("a tool's 'type' must be text", "tools")
    if kind.startswith(CLIENT_TOOL_PREFIXES):
        return None
    return re.sub(r"_\d{8}$", "", kind)  # web_search_20250305 -> web_search


class MessagesFormat(WireFormat):
    """Anthropic Messages, with Anthropic's headers and error objects."""

    name = "messages"
    path = endpoints.MESSAGES
    providers = frozenset({"anthropic", "simulator"})
    limit_field = "max_tokens"
    required_limit = True

    def check(self, body: dict[str, Any], tools_allowed: frozenset[str]) -> None:
        if self.required_limit and body.get("max_tokens") is None:
            raise invalid("max_tokens: Field required", "max_tokens")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid("'messages' must be a non-empty list", "messages")
        if body.get("mcp_servers"):
            base.refuse_tools([{"type": "mcp"}], lambda tool: "mcp", tools_allowed)
        if body.get("container") is not None and "code_execution" not in tools_allowed:
            raise invalid("'container' is not accepted: code execution is not allowed", "container")
        base.within_bounds(body, MESSAGES_BOUNDS)
        thinking = body.get("thinking")
        if isinstance(thinking, dict):
            base.within_bounds(thinking, (Bound("budget_tokens", 1, MAX_OUTPUT_TOKENS),))
        base.refuse_tools(body.get("tools"), _tool_kind, tools_allowed)

    def rewrite(self, body: dict[str, Any], model: str, limits: Limits) -> Rewritten:
        limit = body.get("max_tokens")
        return Rewritten(base.dump({**body, "model": model}), None, limit if limit else 0)

    def usage(self, answer: dict[str, Any]) -> TokenUsage | None:
        return anthropic_usage(answer.get("usage"))

    def error_body(
        self, status: int, err_type: str, code: str | None, message: str, param: str | None = None
    ) -> bytes:
        kind = ERROR_TYPES.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message, "code": code}}
        return json.dumps(body, separators=(",", ":")).encode()

    def stream_error(self, status: int, err_type: str, code: str, message: str) -> bytes:
        data = self.error_body(status, err_type, code, message)
        return b"event: error\ndata: " + data + b"\n\n"

    def upstream_headers(
        self, request_headers: dict[bytes, bytes], tools_allowed: frozenset[str]
    ) -> list[tuple[str, str]]:
        out = []
        version = request_headers.get(b"anthropic-version")
        if version is None or not _HEADER_VALUE.match(version):
            version = DEFAULT_VERSION.encode()
        out.append(("anthropic-version", version.decode()))
        beta = refuse_betas(request_headers.get(b"anthropic-beta"), tools_allowed)
        if beta is not None:
            out.append(("anthropic-beta", beta))
        return out

    def pump(self, body: dict[str, Any], cap: int) -> SsePump:
        return MessagesPump(self, cap)


class CountTokensFormat(MessagesFormat):
    """Counting a prompt's tokens: metered like any call (it reserves its prompt bound, so
    a run whose budget could not send the prompt cannot count it either, and it holds a
    place in the budget's decisions), settled at 0 tokens (the provider charges none)."""

    name = "count_tokens"
    path = endpoints.COUNT_TOKENS
    required_limit = False
    stream_field = None

    def usage(self, answer: dict[str, Any]) -> TokenUsage | None:
        return TokenUsage()

    def rewrite(self, body: dict[str, Any], model: str, limits: Limits) -> Rewritten:
        return Rewritten(base.dump({**body, "model": model}), None, 0)


class MessagesPump(SsePump):
    """Reads input usage from ``message_start`` and output from ``message_delta``; an
    event type Anthropic does not document breaks the stream off."""

    def __init__(self, fmt: WireFormat, cap: int) -> None:
        super().__init__(fmt, cap)
        self._start: dict[str, Any] | None = None

    def _event(self, event: bytes) -> bytes:
        data = self.data_of(event)
        name = self.event_name(event)
        if data is None:
            return event + b"\n\n"
        if name not in STREAM_EVENTS:
            self.break_off(f"upstream sent an unknown event type {str(name)[:80]!r}")
            return b""
        if name in ("message_start", "message_delta", "message_stop", "error"):
            try:
                obj = json.loads(data)
            except ValueError:
                self.break_off("upstream sent an event that is not JSON")
                return b""
            try:
                self._read(name, obj if isinstance(obj, dict) else {})
            except UsageError as exc:
                self.break_off(f"upstream usage does not add up: {exc}")
                return b""
        return event + b"\n\n"

    def _read(self, name: str, obj: dict[str, Any]) -> None:
        if name == "message_start":
            message = obj.get("message") if isinstance(obj.get("message"), dict) else {}
            assert isinstance(message, dict)
            if isinstance(message.get("model"), str):
                self.model = message["model"]
            start = message.get("usage")
            self._start = start if isinstance(start, dict) else {}
            anthropic_usage({"output_tokens": 0, **self._start})  # its counts are sound
        elif name == "message_delta":
            delta = obj.get("usage")
            if self._start is None or not isinstance(delta, dict):
                raise UsageError("message_delta without usage, or before message_start")
            merged = {**self._start, **{k: v for k, v in delta.items() if v is not None}}
            for key in INPUT_KEYS:
                if base.count(merged, key) < base.count(self._start, key):
                    raise UsageError(f"message_delta {key} is below message_start's")
            self.usage = anthropic_usage(merged)
        elif name == "message_stop":
            self.done = True
        elif name == "error":
            self.cut = "upstream sent an error mid-stream"
