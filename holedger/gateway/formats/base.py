"""What every wire format shares: the format interface, strict usage reading, the SSE pump.

A :class:`WireFormat` is everything the gateway needs to serve one endpoint: how to read
and check a request (``parse``), the conservative reservation (``reservation``), what to
forward (``rewrite``), the usage of a complete answer (``usage``), the error body its
clients understand (``error_body``) and how to read its stream (``pump``). The gateway's
checks, budget and recording are the same for every format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from holedger.gateway.denial import Denial, invalid
from holedger.gateway.formats.fetched import refuse_fetched
from holedger.gateway.limits import Bound, OutOfBounds, check_bounds
from holedger.gateway.wire import split_sse, sse_data
from holedger.protocol import endpoints
from holedger.schemas.canonical import has_utf8_form
from holedger.schemas.events import TokenUsage

# More tokens than any one call can use: a count above it is not believed, and every
# recorded count stays an exact JSON number.
MAX_REPORTED_TOKENS = 2**32
IMAGE_PART_TYPES = frozenset(
    {"image_url", "input_image", "input_audio", "file", "input_file", "image", "document"}
)


class UsageError(ValueError):
    """A usage block that cannot be believed: a count that is not a whole number, or
    parts that do not add up. The call is then charged its whole reservation."""


def count(block: dict[str, Any], key: str, *, required: bool = False) -> int:
    """A token count of a usage block: absent (or null) is 0 unless required."""
    value = block.get(key)
    if value is None and not required:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UsageError(f"usage {key} = {value!r} is not a whole number of tokens")
    if value > MAX_REPORTED_TOKENS:
        raise UsageError(f"usage {key} = {value} is beyond belief")
    return value


def details(block: dict[str, Any], key: str) -> dict[str, Any]:
    value = block.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"usage {key} is not an object")
    return value


def usage_of(
    inp: int, out: int, *, cached: int = 0, cache_write: int = 0, reasoning: int = 0
) -> TokenUsage:
    """holedger's convention: input includes cache reads and writes, output includes
    reasoning, total = input + output. Parts larger than their whole do not add up."""
    if cached + cache_write > inp:
        raise UsageError(f"usage: cached {cached} + cache write {cache_write} > input {inp}")
    if reasoning > out:
        raise UsageError(f"usage: reasoning {reasoning} > output {out}")
    return TokenUsage(
        input=inp,
        cached=cached,
        cache_write=cache_write,
        output=out,
        reasoning=reasoning,
        total=inp + out,
    )


def check_total(block: dict[str, Any], key: str, usage: TokenUsage) -> TokenUsage:
    """The upstream's own total, when it gives one, must be input + output."""
    if block.get(key) is not None and count(block, key) != usage.total:
        raise UsageError(
            f"usage {key} = {block[key]} is not input {usage.input} + output {usage.output}"
        )
    return usage


def counted_usage(
    block: Any, inp: str, out: str, *, out_required: bool = False
) -> TokenUsage | None:
    """An OpenAI usage block (chat, embeddings: prompt/completion; Responses: input/output):
    ``{inp}`` with ``{inp}_details.cached_tokens``, ``{out}`` with
    ``{out}_details.reasoning_tokens``, and ``total_tokens``; None when there is none."""
    if not isinstance(block, dict):
        return None
    usage = usage_of(
        count(block, inp, required=True),
        count(block, out, required=out_required),
        cached=count(details(block, f"{inp}_details"), "cached_tokens"),
        reasoning=count(details(block, f"{out}_details"), "reasoning_tokens"),
    )
    return check_total(block, "total_tokens", usage)


# ---------------------------------------------------------------------------- requests

# The providers that speak OpenAI's wire formats.
OPENAI_PROVIDERS = frozenset({"openai", "openai-compatible", "simulator"})
# Request fields with which an OpenAI-compatible router or proxy picks other models
# (OpenRouter's "models", LiteLLM's "fallbacks"): refused, or they bypass the allow-list.
MODEL_SWITCH_FIELDS = ("models", "fallbacks")
# The name in TaskTerms.server_tools that lets a request use them.
MODEL_SWITCH = "model_switch"


def parse_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # too deep a nesting too
        raise Denial(
            400, "invalid_request_error", "invalid_json", "body is not valid JSON"
        ) from exc
    if not isinstance(body, dict):
        raise invalid("body is not a JSON object")
    return body


def require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required", "model")
    if not has_utf8_form(model):
        # JSON can spell a lone surrogate ("\ud800"), which no event can hold as text.
        raise invalid("'model' must be text (it holds a lone surrogate escape)", "model")
    return model


def open_request(raw: bytes, tools_allowed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What every format's ``parse`` begins with: a JSON object naming one model, and no
    field with which an upstream would serve another one (the allow-list never saw it),
    unless the terms allow ``model_switch``: then each such field must be a list of model
    names, every one of which the allow-list is asked about (``switch_models``)."""
    body = parse_object(raw)
    require_model(body)
    if MODEL_SWITCH not in tools_allowed:
        refuse_fields(body, MODEL_SWITCH_FIELDS, "name exactly one model in 'model'")
    switch_models(body)
    return body


def switch_models(body: dict[str, Any]) -> list[str]:
    """The other models a request names in its model-switching fields."""
    names: list[str] = []
    for key in MODEL_SWITCH_FIELDS:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(
            isinstance(v, str) and v and has_utf8_form(v) for v in value
        ):
            raise invalid(f"'{key}' must be a list of model names", key)
        names += value
    return names


def within_bounds(body: dict[str, Any], bounds: tuple[Bound, ...]) -> None:
    """Each numeric field of ``bounds`` that ``body`` holds is within its range (400 else,
    naming the field): checked before any arithmetic, so no limit the upstream might read
    as "no limit", and none beyond any model, can make a call outgrow its reservation."""
    try:
        check_bounds(body, bounds)
    except OutOfBounds as exc:
        raise invalid(exc.message, exc.field) from exc


def refuse_fields(body: dict[str, Any], fields: Iterable[str], why: str) -> None:
    for key in fields:
        if key in body and body[key] is not None:
            raise invalid(f"'{key}' is not accepted: {why}", key)


def refuse_tools(
    tools: Any, kind: Callable[[dict[str, Any]], str | None], allowed: frozenset[str]
) -> None:
    """Refuse every tool ``kind`` names as server-side (run by the provider, reaching
    outside: web search, code execution, remote MCP servers...) unless ``allowed``."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise invalid("'tools' must be a list", "tools")
    for tool in tools:
        if not isinstance(tool, dict):
            raise invalid("each tool must be an object", "tools")
        server = kind(tool)
        if server is not None and server not in allowed:
            raise Denial(
                403,
                "permission_error",
                "tool_not_allowed",
                f"server-side tool {server!r} reaches outside the run and its terms do not "
                "allow it; give the harness a function tool instead",
                param="tools",
            )


def media_parts(value: Any, depth: int = 0) -> int:
    """How many image, audio or file parts a request's content holds, at any depth."""
    if depth > 8:
        return 0
    if isinstance(value, list):
        return sum(media_parts(v, depth + 1) for v in value)
    if isinstance(value, dict):
        own = 1 if value.get("type") in IMAGE_PART_TYPES else 0
        return own + sum(
            media_parts(v, depth + 1) for v in value.values() if isinstance(v, list | dict)
        )
    return 0


def dump(body: dict[str, Any]) -> bytes:
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): keep it as an escape
        return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Limits:
    """The gateway's settings a format needs."""

    default_max_tokens: int
    max_tokens_field: str
    media_part_tokens: int


@dataclass(frozen=True)
class Rewritten:
    body: bytes
    max_tokens_imposed: int | None
    output_limit: int  # the output tokens reserved per choice
    choices: int = 1


# ---------------------------------------------------------------------------- formats


class WireFormat:
    """One endpoint's wire format. Subclasses set the class attributes and override."""

    name: ClassVar[str]  # recorded in GatewayCall.format
    path: ClassVar[str]  # the gateway's path, e.g. /v1/responses
    providers: ClassVar[frozenset[str]]  # upstream providers that speak it
    limit_field: ClassVar[str]  # the request's output limit, named in budget refusals
    stream_field: ClassVar[str | None] = "stream"

    @property
    def metered(self) -> bool:
        """Whether a call holds a reservation (the protocol's list of endpoints says)."""
        return endpoints.METERED[self.path]

    @property
    def upstream_path(self) -> str:
        """The path under the upstream's base URL (which ends in /v1)."""
        return self.path.removeprefix("/v1")

    def parse(self, raw: bytes, tools_allowed: frozenset[str]) -> dict[str, Any]:
        """The request, checked (``open_request``, then the format's own ``check``)."""
        body = open_request(raw, tools_allowed)
        self.check(body, tools_allowed)
        refuse_fetched(body, tools_allowed)
        return body

    def check(self, body: dict[str, Any], tools_allowed: frozenset[str]) -> None:
        """Refuse (a Denial) a request this format will not forward as it is."""
        raise NotImplementedError

    def streams(self, body: dict[str, Any]) -> bool:
        return self.stream_field is not None and body.get(self.stream_field) is True

    def rewrite(self, body: dict[str, Any], model: str, limits: Limits) -> Rewritten:
        raise NotImplementedError

    def prompt_bound(self, size: int, body: dict[str, Any], limits: Limits) -> int:
        """An upper bound of the prompt's tokens: every byte of the forwarded body (a
        byte-level token covers at least one byte), plus a fixed cost per media part."""
        return size + media_parts(body) * limits.media_part_tokens

    def usage(self, answer: dict[str, Any]) -> TokenUsage | None:
        """The usage of a complete answer; None when it has none; UsageError when it
        does not add up."""
        raise NotImplementedError

    def error_body(
        self, status: int, err_type: str, code: str | None, message: str, param: str | None = None
    ) -> bytes:
        body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
        return json.dumps(body, separators=(",", ":")).encode()

    def stream_error(self, status: int, err_type: str, code: str, message: str) -> bytes:
        """The last SSE event of a stream the gateway ends with an error."""
        return b"data: " + self.error_body(status, err_type, code, message) + b"\n\n"

    def upstream_headers(
        self, request_headers: dict[bytes, bytes], tools_allowed: frozenset[str]
    ) -> list[tuple[str, str]]:
        """Request headers of the client's passed on to the upstream (never its token); a
        Denial for one that turns on what the terms do not allow."""
        return []

    def pump(self, body: dict[str, Any], cap: int) -> SsePump:
        raise NotImplementedError


class SsePump:
    """Forwards a stream's SSE events unchanged while reading its usage.

    ``feed`` returns the bytes to send on; ``broken`` is set when the stream can no
    longer be trusted (an unknown event, usage that does not add up): the gateway then
    stops forwarding, ends the stream with ``error_event`` and charges the reservation.
    """

    def __init__(self, fmt: WireFormat, cap: int) -> None:
        self.fmt = fmt
        self.buffer = b""
        self.usage: TokenUsage | None = None
        self.model: str | None = None
        self.cut: str | None = None  # why the stream ended early
        self.broken: str | None = None  # why the gateway must end the stream now
        self.done = False  # the stream's last event has been seen
        self.cap = cap
        self._sent: list[bytes] = []
        self._sent_size = 0

    @property
    def sent(self) -> bytes:
        return b"".join(self._sent)

    def _keep(self, data: bytes) -> None:
        if self._sent_size < self.cap:
            self._sent.append(data[: self.cap - self._sent_size])
            self._sent_size += len(self._sent[-1])

    def feed(self, chunk: bytes) -> bytes:
        events, self.buffer = split_sse(self.buffer + chunk)
        out = []
        for event in events:
            if self.broken is not None:
                break
            data = self._event(event)
            if data and self.broken is None:
                out.append(data)
        data = b"".join(out)
        self._keep(data)
        return data

    def finish(self) -> bytes:
        rest = self.buffer
        self.buffer = b""
        if not rest.strip() or self.broken is not None:
            return b""
        data = self._event(rest)
        if self.broken is not None:
            return b""
        self._keep(data)
        return data

    def error_event(self, message: str, code: str = "upstream_stream_cut") -> bytes:
        data = self.fmt.stream_error(502, "upstream_error", code, message)
        self._keep(data)
        return data

    def break_off(self, why: str) -> None:
        self.broken = why
        self.cut = why
        self.usage = None  # a stream that cannot be trusted is charged its reservation

    def _event(self, event: bytes) -> bytes:
        raise NotImplementedError

    @staticmethod
    def data_of(event: bytes) -> bytes | None:
        return sse_data(event)

    @staticmethod
    def event_name(event: bytes) -> str | None:
        for line in event.split(b"\n"):
            if line.startswith(b"event:"):
                return line[6:].strip().decode("utf-8", "replace")
        return None
