"""The offline simulator: a seeded, stochastic stand-in for a target model. Not an LLM.

``SimulatedModel`` answers OpenAI chat-completion requests offline so that the bundled
``officeqa-lite`` demo task can be optimized and scored without any provider. It is a
small, documented program (docs/SIMULATOR.md), served by the gateway under the model id
``holedger-sim-1`` and called "the simulator" everywhere.

What it does with a request:

* It looks for a demo-task question in the user messages (the question language of the
  officeqa-lite generator). Without one it gives a short generic reply.
* It reads the facts it is given: company report documents (a ``# Company: Annual
  Report`` heading and a ``| Qn YYYY | ... |`` table) anywhere in its messages, usually
  tool results. It never sees an answer key; a fact that is not in its context is guessed.
* If a needed fact is missing and the request offers a usable tool (an OpenAI function
  tool with a string parameter), it calls that tool in the OpenAI ``tool_calls`` format,
  one company per turn, never repeating a call it already made.
* Otherwise it answers, computing lookups, sums, differences and percentage changes.

How it responds to the eight harness levers:

1. prompt: a system prompt that says nothing about documents, reports or tools makes it
   skip the tools and answer from "memory" (a guess) more often;
2. context management: every document in context that the question does not need, and
   every 1000 prompt tokens past 1200, raises the chance of reading a neighbouring row;
3. step cap: it needs one turn per company to look up plus one turn to answer;
4. retry and timeout policy: about 4% of calls raise ``SimulatorTransientError``
   (500/502/503); a retried call is drawn afresh;
5. tool schema: a parameter named or described as a company or document name gets the
   company name; a vague one often gets the whole question pasted in;
6. answer extraction: the reply format varies unless the prompt asks for ``FINAL ANSWER:``,
   for "only the number", or ``response_format`` asks for JSON;
7. retrieval policy: it answers only from its context, so truncated or missing documents
   mean guessed numbers;
8. reasoning effort: ``reasoning_effort`` (or a cue such as "step by step") buys more
   reasoning tokens and fewer arithmetic slips.

Determinism: the content of a reply is a function of (seed, request body); whether a call
fails transiently also depends on how many times the same body was seen before. Usage is
reported like a provider (input includes cached, output includes reasoning) and a prompt
prefix seen recently is reported as cached, from a bounded memory of prompt prefixes.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from holedger.gateway.sim_reading import (
    Context,
    Fact,
    Question,
    count_tokens,
    parse_question,
    read_documents,
    text_of,
)

SIMULATOR_MODEL = "holedger-sim-1"

TRANSIENT_ERROR_RATE = 0.04
TRANSIENT_STATUSES = (500, 502, 503)
CACHE_MIN_TOKENS = 128
CACHE_GRANULARITY = 64
PREFIX_MEMORY = 4096

EFFORT_LEVELS = ("none", "minimal", "low", "medium", "high", "xhigh")
ARITHMETIC_SLIP = {
    "none": 0.40,
    "minimal": 0.35,
    "low": 0.25,
    "medium": 0.15,
    "high": 0.04,
    "xhigh": 0.02,
}
REASONING_BASE = {"none": 0, "minimal": 0, "low": 90, "medium": 300, "high": 1000, "xhigh": 2200}
SKIP_TOOLS_GENERIC = 0.06
SKIP_TOOLS_TASK_PROMPT = 0.03
VAGUE_SCHEMA_PASTES_QUESTION = 0.5
FORMAT_NONCOMPLIANCE = 0.02

_TASK_WORDS = re.compile(
    r"\b(documents?|reports?|search|tools?|look ?up|corpus|tables?|filings?)\b", re.I
)
_EFFORT_CUE = re.compile(
    r"step by step|think carefully|double[- ]check|verify (your|the) arithmetic", re.I
)
_FINAL_ANSWER_CUE = re.compile(r"final answer:", re.I)
_ONLY_NUMBER_CUE = re.compile(
    r"(only|just|nothing but) (with )?the (final )?(number|numeric (answer|value))", re.I
)


class SimulatorTransientError(Exception):
    """A simulated transient upstream failure; the HTTP face answers with ``status``."""

    def __init__(self, status: int, message: str = "simulated transient upstream error") -> None:
        super().__init__(message)
        self.status = status


class SimulatorRequestError(ValueError):
    """The request is not a well-formed chat completion request (an HTTP 400)."""


def _validate(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        raise SimulatorRequestError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SimulatorRequestError("'messages' must be a non-empty array")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise SimulatorRequestError(f"messages[{index}] must be an object with a 'role'")
        if message["role"] not in ("system", "developer", "user", "assistant", "tool"):
            raise SimulatorRequestError(f"messages[{index}] has an unknown role")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise SimulatorRequestError("'tools' must be an array")
    return messages


@dataclass(frozen=True)
class _ToolChoice:
    name: str
    param: str
    precise: bool
    enum: tuple[str, ...] | None
    extra: dict[str, Any]


_PRECISE_NAMES = {"company", "company_name", "name", "document", "doc", "title", "entity"}


def _usable_tool(tools: Any, tool_choice: Any) -> _ToolChoice | None:
    if not isinstance(tools, list) or tool_choice == "none":
        return None
    forced = None
    if isinstance(tool_choice, dict):
        forced = (tool_choice.get("function") or {}).get("name")
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        if forced and function["name"] != forced:
            continue
        params = function.get("parameters") or {}
        props = params.get("properties") if isinstance(params, dict) else None
        if not isinstance(props, dict):
            continue
        strings = [
            (name, spec)
            for name, spec in props.items()
            if isinstance(spec, dict) and spec.get("type") == "string"
        ]
        if not strings:
            continue

        def precision(item: tuple[str, dict[str, Any]]) -> bool:
            name, spec = item
            described = str(spec.get("description", "")).lower()
            return (
                name.lower() in _PRECISE_NAMES
                or "company" in described
                or "document name" in described
                or isinstance(spec.get("enum"), list)
            )

        strings.sort(key=lambda item: not precision(item))
        name, spec = strings[0]
        enum = spec.get("enum")
        extra: dict[str, Any] = {}
        required = params.get("required")
        for other in required if isinstance(required, list) else []:
            if other == name or not isinstance(props.get(other), dict):
                continue
            kind = props[other].get("type")
            extra[other] = 1 if kind in ("integer", "number") else ""
        return _ToolChoice(
            function["name"],
            name,
            precision((name, spec)),
            tuple(str(e) for e in enum) if isinstance(enum, list) else None,
            extra,
        )
    return None


class _Draws:
    """Uniform draws in [0, 1) named by purpose, from SHA-256 of the seed and a key."""

    def __init__(self, seed: int, key: str) -> None:
        self._prefix = f"{seed}\x00{key}\x00"

    def uniform(self, name: str) -> float:
        digest = hashlib.sha256((self._prefix + name).encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def choice(self, name: str, n: int) -> int:
        return min(n - 1, int(self.uniform(name) * n))


def _fmt(value: Decimal, kind: str, commas: bool) -> str:
    if kind == "pct_change":
        return str(value.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))
    integral = value.quantize(Decimal("1"), rounding=ROUND_HALF_UP)
    return f"{integral:,}" if commas else str(integral)


class SimulatedModel:
    """The offline simulator of a target model; see the module docstring."""

    def __init__(self, seed: int = 0, model_name: str = SIMULATOR_MODEL) -> None:
        self.seed = seed
        self.model_name = model_name
        self._lock = threading.Lock()
        self._prefixes: OrderedDict[str, None] = OrderedDict()
        self._seen_bodies: OrderedDict[str, int] = OrderedDict()

    def models(self) -> list[str]:
        """The model ids this simulator answers as."""
        return [self.model_name]

    # ------------------------------------------------------------------ public entry

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one chat completion request, or raise SimulatorTransientError."""
        messages = _validate(body)
        body_digest = hashlib.sha256(
            json.dumps(body, sort_keys=True, default=str).encode()
        ).hexdigest()
        occurrence = self._occurrence(body_digest)
        failure = _Draws(self.seed, f"{body_digest}:{occurrence}")
        if failure.uniform("transient") < TRANSIENT_ERROR_RATE:
            status = TRANSIENT_STATUSES[failure.choice("status", len(TRANSIENT_STATUSES))]
            raise SimulatorTransientError(status, f"simulated upstream error {status}")

        prompt_tokens, boundaries = self._prompt_tokens(body, messages)
        cached = self._cached_tokens(boundaries)
        # Content draws are keyed by the question (in each draw's name), not by the whole
        # body, so two harnesses asking the same question meet the same luck.
        draws = _Draws(self.seed, "content")
        message, finish, reasoning = self._respond(body, messages, prompt_tokens, draws)
        completion_text = text_of(message.get("content")) + json.dumps(
            message.get("tool_calls", "")
        )
        visible = count_tokens(completion_text) + 1
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and limit > 0 and reasoning + visible > limit:
            finish = "length"
            reasoning = min(reasoning, limit)
            visible = limit - reasoning
            message = {"role": "assistant", "content": _truncate(message, visible)}
        completion = visible + reasoning
        return {
            "id": f"chatcmpl-sim-{body_digest[:24]}",
            "object": "chat.completion",
            "created": 0,
            "model": self.model_name,
            "system_fingerprint": f"{self.model_name}-seed{self.seed}",
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": reasoning,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            },
        }

    # ------------------------------------------------------------------ bookkeeping

    def _occurrence(self, body_digest: str) -> int:
        with self._lock:
            count = self._seen_bodies.pop(body_digest, 0)
            self._seen_bodies[body_digest] = count + 1
            while len(self._seen_bodies) > PREFIX_MEMORY:
                self._seen_bodies.popitem(last=False)
        return count

    def _prompt_tokens(
        self, body: dict[str, Any], messages: list[dict[str, Any]]
    ) -> tuple[int, list[tuple[str, int]]]:
        """Prompt size and the (prefix hash, tokens so far) after the tools and each message."""
        running = hashlib.sha256(str(body.get("model", "")).encode())
        tokens = 3
        tools = body.get("tools")
        if tools:
            tool_text = json.dumps(tools, sort_keys=True, default=str)
            running.update(tool_text.encode())
            tokens += count_tokens(tool_text)
        boundaries = [(running.hexdigest(), tokens)]
        for message in messages:
            text = text_of(message.get("content"))
            calls = message.get("tool_calls")
            if calls:
                text += json.dumps(calls, sort_keys=True, default=str)
            running.update(json.dumps(message, sort_keys=True, default=str).encode())
            tokens += 4 + count_tokens(text)
            boundaries.append((running.hexdigest(), tokens))
        return tokens, boundaries

    def _cached_tokens(self, boundaries: list[tuple[str, int]]) -> int:
        """Tokens of the longest recently seen prefix, in cache blocks; remembers this one."""
        best = 0
        with self._lock:
            for digest, tokens in boundaries:
                if digest in self._prefixes:
                    self._prefixes.move_to_end(digest)
                    best = max(best, tokens)
            for digest, _ in boundaries:
                self._prefixes[digest] = None
                self._prefixes.move_to_end(digest)
            while len(self._prefixes) > PREFIX_MEMORY:
                self._prefixes.popitem(last=False)
        if best < CACHE_MIN_TOKENS:
            return 0
        return best - best % CACHE_GRANULARITY

    # ------------------------------------------------------------------ behaviour

    def _respond(
        self,
        body: dict[str, Any],
        messages: list[dict[str, Any]],
        prompt_tokens: int,
        draws: _Draws,
    ) -> tuple[dict[str, Any], str, int]:
        instructions = "\n".join(
            text_of(m.get("content")) for m in messages if m["role"] in ("system", "developer")
        )
        user_text = "\n".join(text_of(m.get("content")) for m in messages if m["role"] == "user")
        question = None
        for message in messages:
            if message["role"] == "user":
                question = parse_question(text_of(message.get("content")))
                if question:
                    break
        if question is None:
            return _generic_reply(), "stop", 0

        context = Context()
        for message in messages:
            read_documents(text_of(message.get("content")), context)
            if message["role"] == "tool":
                context.tool_turns += 1
            for call in message.get("tool_calls") or []:
                arguments = (call.get("function") or {}).get("arguments", "")
                context.searched.add(str(arguments).lower())

        effort = _effort(body, instructions + "\n" + user_text)
        key = question.text
        missing = [fact for fact in question.facts() if _lookup(context, fact) is None]
        tool = _usable_tool(body.get("tools"), body.get("tool_choice"))
        if missing and tool is not None:
            first_turn = context.tool_turns == 0 and not context.facts
            skip = (
                SKIP_TOOLS_TASK_PROMPT if _TASK_WORDS.search(instructions) else (SKIP_TOOLS_GENERIC)
            )
            if not (first_turn and draws.uniform(f"{key}:skip-tools") < skip):
                call = self._tool_call(tool, question, missing, context, draws)
                if call is not None:
                    reasoning = _reasoning_tokens(effort, question, draws, tool_turn=True)
                    message = {"role": "assistant", "content": None, "tool_calls": [call]}
                    return message, "tool_calls", reasoning

        value = _answer(question, context, prompt_tokens, effort, draws)
        content = _render(question, value, body, instructions + "\n" + user_text, draws)
        reasoning = _reasoning_tokens(effort, question, draws, tool_turn=False)
        return {"role": "assistant", "content": content}, "stop", reasoning

    def _tool_call(
        self,
        tool: _ToolChoice,
        question: Question,
        missing: list[Fact],
        context: Context,
        draws: _Draws,
    ) -> dict[str, Any] | None:
        for company in dict.fromkeys(fact[0] for fact in missing):
            if tool.enum is not None:
                slug = _slug(company)
                options = [e for e in tool.enum if slug in _slug(e)]
                if not options:
                    continue
                value = options[0]
            elif tool.precise or draws.uniform(f"{question.text}:{company}:vague") >= (
                VAGUE_SCHEMA_PASTES_QUESTION
            ):
                value = company
            else:
                value = question.text
            arguments = json.dumps({tool.param: value, **tool.extra})
            if arguments.lower() in context.searched:
                continue
            call_id = (
                "call_"
                + hashlib.sha256(
                    f"{self.seed}:{question.text}:{arguments}:{context.tool_turns}".encode()
                ).hexdigest()[:20]
            )
            return {
                "id": call_id,
                "type": "function",
                "function": {"name": tool.name, "arguments": arguments},
            }
        return None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _lookup(context: Context, fact: Fact) -> Decimal | None:
    company, metric, period = fact
    return context.facts.get((company.lower(), metric, period))


def _effort(body: dict[str, Any], prompt_text: str) -> str:
    effort = body.get("reasoning_effort")
    if not isinstance(effort, str) or effort not in EFFORT_LEVELS:
        effort = "medium"
    rank = EFFORT_LEVELS.index(effort)
    if _EFFORT_CUE.search(prompt_text) and rank < EFFORT_LEVELS.index("high"):
        effort = EFFORT_LEVELS[rank + 1]
    return effort


def _reasoning_tokens(effort: str, question: Question, draws: _Draws, *, tool_turn: bool) -> int:
    base = REASONING_BASE[effort] * (1 + len(question.facts())) // 2
    if tool_turn:
        base = base // 3
    jitter = 0.7 + 0.6 * draws.uniform(f"{question.text}:reasoning:{tool_turn}")
    return int(base * jitter)


def _answer(
    question: Question, context: Context, prompt_tokens: int, effort: str, draws: _Draws
) -> Decimal:
    key = question.text
    needed = {fact[0].lower() for fact in question.facts()}
    distractors = len(context.documents - needed)
    slip = 0.01 + 0.03 * distractors + 0.06 * max(0, prompt_tokens - 1200) / 1000
    slip = min(slip, 0.5)
    values: list[Decimal] = []
    for index, fact in enumerate(question.facts()):
        value = _lookup(context, fact)
        if value is None:
            # Not in context: the simulator makes up a plausible figure.
            guess = 200 + int(draws.uniform(f"{key}:guess:{index}") * 4800)
            values.append(Decimal(guess))
            continue
        if draws.uniform(f"{key}:lookup-slip:{index}") < slip:
            neighbour = _neighbour(context, fact)
            if neighbour is not None:
                value = neighbour
        values.append(value)
    result = _compute(question.kind, values)
    if question.kind != "lookup" and draws.uniform(f"{key}:arith-slip") < ARITHMETIC_SLIP[effort]:
        result = _slip(question.kind, values, result)
    return result


def _neighbour(context: Context, fact: Fact) -> Decimal | None:
    company, metric, period = fact
    quarter, year = int(period[1]), period[3:]
    other = f"Q{quarter + 1 if quarter < 4 else quarter - 1} {year}"
    return context.facts.get((company.lower(), metric, other))


def _compute(kind: str, values: list[Decimal]) -> Decimal:
    if kind == "lookup":
        return values[0]
    if kind in ("sum", "cross_sum"):
        return sum(values, Decimal(0))
    if kind in ("difference",):
        return values[1] - values[0]
    if kind == "cross_difference":
        return values[0] - values[1]
    if values[0] == 0:
        return Decimal(0)
    return (values[1] - values[0]) / values[0] * 100


def _slip(kind: str, values: list[Decimal], result: Decimal) -> Decimal:
    if kind in ("sum", "cross_sum"):
        return result - values[-1]
    if kind in ("difference", "cross_difference"):
        return -result if result else result + 10
    if values[1] == 0:
        return result + 1
    return (values[1] - values[0]) / values[1] * 100


_FREE_STYLES = (
    "The {metric} figure is {commas}.",
    "**{plain}**",
    "Answer: {plain}",
    "{plain}",
    "Based on the report, the answer is ${commas} thousand.",
    "In USD thousands, the answer is {plain}.",
    "The answer is {commas}.",
    "From the table: {plain}",
    "That comes to {commas}.",
)
_FREE_PCT_STYLES = (
    "The change was {plain}%.",
    "**{plain}%**",
    "Answer: {plain}%",
    "{plain}",
    "It changed by about {plain} percent.",
    "Rounded to one decimal place: {plain}%",
    "The percentage change is {plain}%.",
    "Change: {plain}%",
    "That is a change of {plain}%.",
)


def _render(
    question: Question, value: Decimal, body: dict[str, Any], prompt_text: str, draws: _Draws
) -> str:
    plain = _fmt(value, question.kind, commas=False)
    commas = _fmt(value, question.kind, commas=True)
    key = question.text
    complies = draws.uniform(f"{key}:format") >= FORMAT_NONCOMPLIANCE
    response_format = body.get("response_format")
    if complies and isinstance(response_format, dict):
        if response_format.get("type") in ("json_object", "json_schema"):
            return json.dumps({"answer": plain})
    if complies and _FINAL_ANSWER_CUE.search(prompt_text):
        return f"I read the quarterly table for the {question.metric}.\nFINAL ANSWER: {plain}"
    if complies and _ONLY_NUMBER_CUE.search(prompt_text):
        return plain
    styles = _FREE_PCT_STYLES if question.kind == "pct_change" else _FREE_STYLES
    style = styles[draws.choice(f"{key}:style", len(styles))]
    return style.format(metric=question.metric, plain=plain, commas=commas)


def _generic_reply() -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": (
            "This is the holedger offline simulator (not a language model). It answers "
            "questions about the officeqa-lite company reports it is shown."
        ),
    }


def _truncate(message: dict[str, Any], tokens: int) -> str:
    text = text_of(message.get("content"))
    words: Iterable[str] = text.split(" ")
    return " ".join(list(words)[: max(0, tokens)])
