"""OpenAI Responses API: ``POST /v1/responses``, plain and SSE.

Reservation: prompt bound + ``max_output_tokens`` (which includes reasoning tokens; the
configured default imposed when absent). Usage: ``input_tokens`` (with
``input_tokens_details.cached_tokens``), ``output_tokens`` (with
``output_tokens_details.reasoning_tokens``), ``total_tokens``; in a stream it arrives in
the ``response`` of the last event (``response.completed``, ``response.incomplete`` or
``response.failed``).

Refused: fields that bring in context the body does not hold (``previous_response_id``,
``conversation``, a stored ``prompt``), so the body would not bound the prompt;
``background`` (the work would go on after the call); model-switching fields; and tools
the provider runs itself (web search, file search, code interpreter, remote MCP, image
generation) unless the run's terms allow them.
"""

from __future__ import annotations

import json
from typing import Any

from holedger.gateway.denial import invalid
from holedger.gateway.formats import base
from holedger.gateway.formats.base import Limits, Rewritten, SsePump, UsageError, WireFormat
from holedger.gateway.limits import MAX_OUTPUT_TOKENS, Bound
from holedger.protocol import endpoints
from holedger.schemas.events import TokenUsage

# Tools whose calls the client runs: everything else is run by the provider.
CLIENT_TOOLS = frozenset(
    {"function", "custom", "local_shell", "shell", "apply_patch", "computer_use_preview"}
)
SERVER_CONTEXT_FIELDS = ("previous_response_id", "conversation", "prompt")
# Every numeric field of a Responses request the gateway reads or forwards.
RESPONSES_BOUNDS = (
    Bound("max_output_tokens", 1, MAX_OUTPUT_TOKENS),
    Bound("max_tool_calls", 1, 1024),
    Bound("top_logprobs", 0, 20),
    Bound("temperature", 0, 2, whole=False),
    Bound("top_p", 0, 1, whole=False),
)
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def responses_usage(block: Any) -> TokenUsage | None:
    return base.counted_usage(block, "input_tokens", "output_tokens", out_required=True)


def _tool_kind(tool: dict[str, Any]) -> str | None:
    kind = tool.get("type")
    if not isinstance(kind, str):
        raise invalid("each tool needs a 'type'", "tools")
    return None if kind in CLIENT_TOOLS else kind


class ResponsesFormat(WireFormat):
    """The Responses API: the whole context must be in the request."""

    name = "responses"
    path = endpoints.RESPONSES
    providers = base.OPENAI_PROVIDERS
    limit_field = "max_output_tokens"

    def check(self, body: dict[str, Any], tools_allowed: frozenset[str]) -> None:
        if "input" not in body or body["input"] is None:
            raise invalid("'input' is required", "input")
        if not isinstance(body["input"], str | list):
            raise invalid("'input' must be text or a list of items", "input")
        base.refuse_fields(
            body,
            SERVER_CONTEXT_FIELDS,
            "it brings in context the request does not hold, which the gateway cannot "
            "bound; send the whole input",
        )
        if body.get("background"):
            raise invalid(
                "'background' is not accepted: the call must end with its answer", "background"
            )
        base.within_bounds(body, RESPONSES_BOUNDS)
        base.refuse_tools(body.get("tools"), _tool_kind, tools_allowed)

    def rewrite(self, body: dict[str, Any], model: str, limits: Limits) -> Rewritten:
        out = dict(body)
        out["model"] = model
        asked = body.get("max_output_tokens")
        imposed = None
        if asked is None:
            out["max_output_tokens"] = imposed = limits.default_max_tokens
        return Rewritten(base.dump(out), imposed, asked or limits.default_max_tokens)

    def usage(self, answer: dict[str, Any]) -> TokenUsage | None:
        return responses_usage(answer.get("usage"))

    def stream_error(self, status: int, err_type: str, code: str, message: str) -> bytes:
        # The Responses API's own error event, with an "error" member the SDK raises on.
        inner = {"message": message, "type": err_type, "param": None, "code": code}
        data = {"type": "error", "code": code, "message": message, "param": None, "error": inner}
        return b"event: error\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def pump(self, body: dict[str, Any], cap: int) -> SsePump:
        return ResponsesPump(self, cap)


class ResponsesPump(SsePump):
    """Reads the model from ``response.created`` and the usage from the last event;
    an event type that is neither ``error`` nor ``response.*`` breaks the stream off."""

    def _event(self, event: bytes) -> bytes:
        data = self.data_of(event)
        if data is None:
            return event + b"\n\n"  # a comment or a keep-alive
        name = self.event_name(event)
        if (
            name is None
            or name in TERMINAL_EVENTS
            or name == "response.created"
            or (self.model is None)
        ):
            try:
                obj = json.loads(data)
            except ValueError:
                self.break_off("upstream sent an event that is not JSON")
                return b""
            if not isinstance(obj, dict):
                self.break_off("upstream sent an event that is not an object")
                return b""
            name = obj.get("type") if isinstance(obj.get("type"), str) else name
            response = obj.get("response")
            if isinstance(response, dict):
                if self.model is None and isinstance(response.get("model"), str):
                    self.model = response["model"]
                if name in TERMINAL_EVENTS:
                    self.done = True
                    try:
                        self.usage = responses_usage(response.get("usage"))
                    except UsageError as exc:
                        self.break_off(f"upstream usage does not add up: {exc}")
                        return b""
        if name == "error":
            self.cut = "upstream sent an error mid-stream"
        elif name is None or not name.startswith("response."):
            self.break_off(f"upstream sent an unknown event type {str(name)[:80]!r}")
            return b""
        return event + b"\n\n"
