"""OpenAI Chat Completions: ``POST /v1/chat/completions``, plain and SSE.

Reservation: prompt bound + ``n`` x (``max_completion_tokens`` or ``max_tokens``, the
smaller when both are given; the configured default imposed when neither is). A stream
is always asked for its usage chunk (``stream_options.include_usage``); the chunk is
hidden from a client that did not ask for it.

Refused unless the run's terms allow the server tool: what the upstream runs itself,
reaching outside the run: ``web_search_options`` (OpenAI's search models search the web:
``web_search``), a tool of any type but ``function`` or ``custom``, and an OpenAI-compatible
router's ``plugins`` (OpenRouter's ``web`` plugin: ``web_search``; any other by its id).
"""

from __future__ import annotations

import json
from typing import Any

from holedger.gateway.denial import invalid
from holedger.gateway.formats import base
from holedger.gateway.formats.base import Limits, Rewritten, SsePump, UsageError, WireFormat
from holedger.gateway.limits import CHAT_BOUNDS
from holedger.protocol import endpoints
from holedger.schemas.events import TokenUsage

# Tools whose calls the client runs: any other type is run by the upstream.
CLIENT_TOOLS = frozenset({"function", "custom"})
# A router's plugins by the server tool that allows them (others: their id, '-' as '_').
PLUGIN_TOOLS = {"web": "web_search"}


def openai_usage(block: Any) -> TokenUsage | None:
    """Chat Completions or embeddings usage (prompt_tokens, completion_tokens)."""
    return base.counted_usage(block, "prompt_tokens", "completion_tokens")


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    values = [
        body[key]
        for key in ("max_tokens", "max_completion_tokens")
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool)
    ]
    return min(values) if values else None


def _tool_kind(tool: dict[str, Any]) -> str | None:
    kind = tool.get("type")
    if not isinstance(kind, str):
        raise invalid("each tool needs a 'type'", "tools")
    return None if kind in CLIENT_TOOLS else kind


def _plugin_kind(plugin: dict[str, Any]) -> str:
    name = plugin.get("id")
    if not isinstance(name, str):
        raise invalid("each plugin needs an 'id'", "plugins")
    return PLUGIN_TOOLS.get(name, name.replace("-", "_"))


class ChatFormat(WireFormat):
    """Chat Completions: the reservation reads ``n`` and both output limits."""

    name = "chat"
    path = endpoints.CHAT_COMPLETIONS
    providers = base.OPENAI_PROVIDERS
    limit_field = "max_tokens"

    def check(self, body: dict[str, Any], tools_allowed: frozenset[str]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid("'messages' must be a non-empty list", "messages")
        base.within_bounds(body, CHAT_BOUNDS)
        if body.get("web_search_options") is not None:
            base.refuse_tools([{}], lambda _: "web_search", tools_allowed)
        base.refuse_tools(body.get("tools"), _tool_kind, tools_allowed)
        base.refuse_tools(body.get("plugins"), _plugin_kind, tools_allowed)

    def rewrite(self, body: dict[str, Any], model: str, limits: Limits) -> Rewritten:
        out = dict(body)
        out["model"] = model
        asked = requested_max_tokens(body)
        imposed = None
        if "max_tokens" in body and "max_completion_tokens" in body:
            # Upstreams differ in which of the two they honour: send the one that was
            # reserved (the smaller) in both.
            out["max_tokens"] = out["max_completion_tokens"] = asked
        if asked is None:
            out[limits.max_tokens_field] = imposed = limits.default_max_tokens
        if self.streams(body):
            options = out.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            options["include_usage"] = True
            out["stream_options"] = options
        n = body.get("n", 1)
        choices = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
        return Rewritten(base.dump(out), imposed, asked or limits.default_max_tokens, choices)

    def usage(self, answer: dict[str, Any]) -> TokenUsage | None:
        return openai_usage(answer.get("usage"))

    def pump(self, body: dict[str, Any], cap: int) -> SsePump:
        return ChatPump(self, body, cap)


class ChatPump(SsePump):
    """Reads the usage chunk, hides it when the client did not ask for it."""

    def __init__(self, fmt: WireFormat, body: dict[str, Any], cap: int) -> None:
        super().__init__(fmt, cap)
        options = body.get("stream_options")
        self.client_wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))

    def _event(self, event: bytes) -> bytes:
        data = self.data_of(event)
        if data is None:
            return event + b"\n\n"
        if data == b"[DONE]":
            self.done = True
            return event + b"\n\n"
        if self.model is None or (b'"usage"' in data and b'"usage":null' not in data):
            try:
                obj = json.loads(data)
            except ValueError:
                return event + b"\n\n"
            if isinstance(obj, dict):
                if self.model is None and isinstance(obj.get("model"), str):
                    self.model = obj["model"]
                if obj.get("error") is not None:
                    self.cut = "upstream sent an error mid-stream"
                try:
                    usage = openai_usage(obj.get("usage"))
                except UsageError as exc:
                    self.break_off(f"upstream usage does not add up: {exc}")
                    return b""
                if usage is not None:
                    self.usage = usage
                    if not self.client_wants_usage and not obj.get("choices"):
                        return b""
        return event + b"\n\n"
