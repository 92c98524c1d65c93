"""The simulator's other wire formats: each request is turned into a chat completion request,
answered by :meth:`SimulatedModel.complete` (so every format meets the same seeded
behaviour, tools, errors and usage), and the answer turned back into the format's own
object and stream events. Embeddings are seeded vectors of their own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from typing import Any

from holedger.gateway.sim_reading import count_tokens
from holedger.gateway.simulator import SimulatedModel, SimulatorRequestError

CHUNK_CHARS = 16
DEFAULT_DIMENSIONS = 64
Event = tuple[str, dict[str, Any]]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _chunks(text: str) -> list[str]:
    return [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]


def _call_message(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": calls}


# ---------------------------------------------------------------------------- Responses


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as the chat completion request the simulator answers."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise SimulatorRequestError("'input' must be text or a list of items")
    pending: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise SimulatorRequestError("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "function_call":
            pending.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
            continue
        if pending:
            messages.append(_call_message(pending))
            pending = []
        if kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "message":
            role = item.get("role", "user")
            messages.append({"role": role, "content": _text(item.get("content"))})
    if pending:
        messages.append(_call_message(pending))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool.get("name"),
                "description": tool.get("description", ""),
                "parameters": tool.get("parameters") or {},
            },
        }
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice in ("none", "auto", "required"):
        chat["tool_choice"] = choice
    if isinstance(body.get("max_output_tokens"), int):
        chat["max_completion_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        chat["reasoning_effort"] = reasoning["effort"]
    options = body.get("text")
    fmt = options.get("format") if isinstance(options, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        chat["response_format"] = {"type": fmt["type"]}
    return chat


def chat_to_response(result: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion as the Responses API's response object."""
    choice = result["choices"][0]
    message = choice["message"]
    key = result["id"].removeprefix("chatcmpl-sim-")
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(
            {
                "type": "message",
                "id": f"msg_{key}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
    for i, call in enumerate(message.get("tool_calls") or []):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{key}_{i}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    usage = result["usage"]
    incomplete = choice.get("finish_reason") == "length"
    return {
        "id": f"resp_{key}",
        "object": "response",
        "created_at": 0,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": result["model"],
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": {},
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]
            },
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {
                "reasoning_tokens": usage["completion_tokens_details"]["reasoning_tokens"]
            },
            "total_tokens": usage["total_tokens"],
        },
    }


def response_events(response: dict[str, Any]) -> list[Event]:
    """The Responses API's stream events for a complete response."""
    events: list[Event] = []
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    events.append(("response.created", {"response": start}))
    events.append(("response.in_progress", {"response": start}))
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            opened = {**item, "status": "in_progress", "content": []}
            events.append(("response.output_item.added", {"output_index": index, "item": opened}))
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            empty = {"type": "output_text", "text": "", "annotations": []}
            events.append(("response.content_part.added", {**where, "part": empty}))
            for piece in _chunks(part["text"]):
                events.append(
                    ("response.output_text.delta", {**where, "delta": piece, "logprobs": []})
                )
            done = {**where, "text": part["text"], "logprobs": []}
            events.append(("response.output_text.done", done))
            events.append(("response.content_part.done", {**where, "part": part}))
        else:
            opened = {**item, "status": "in_progress", "arguments": ""}
            events.append(("response.output_item.added", {"output_index": index, "item": opened}))
            where = {"item_id": item["id"], "output_index": index}
            for piece in _chunks(item["arguments"]):
                events.append(("response.function_call_arguments.delta", {**where, "delta": piece}))
            done = {**where, "name": item["name"], "arguments": item["arguments"]}
            events.append(("response.function_call_arguments.done", done))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    last = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append((last, {"response": response}))
    return [
        (name, {"type": name, "sequence_number": n, **data})
        for n, (name, data) in enumerate(events)
    ]


# ---------------------------------------------------------------------------- Messages


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as the chat completion request the simulator answers."""
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for entry in body.get("messages") or []:
        if not isinstance(entry, dict):
            raise SimulatorRequestError("each message must be an object")
        role, content = entry.get("role"), entry.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise SimulatorRequestError("a message's content must be text or a list of blocks")
        texts, calls = [], []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                arguments = json.dumps(block.get("input") or {})
                calls.append(
                    {
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": arguments},
                    }
                )
            elif kind == "tool_result":
                result = block.get("content")
                text = result if isinstance(result, str) else _text(result)
                messages.append(
                    {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
                )
        if calls:
            messages.append({"role": "assistant", "content": "\n".join(texts), "tool_calls": calls})
        elif texts:
            messages.append({"role": role, "content": "\n".join(texts)})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool.get("name"),
                "description": tool.get("description", ""),
                "parameters": tool.get("input_schema") or {},
            },
        }
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and tool.get("type") in (None, "custom")
    ]
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in ("none", "auto"):
            chat["tool_choice"] = kind
        elif kind == "any":
            chat["tool_choice"] = "required"
    if isinstance(body.get("max_tokens"), int):
        chat["max_completion_tokens"] = body["max_tokens"]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens", 0)
        budget = budget if isinstance(budget, int) else 0
        chat["reasoning_effort"] = "low" if budget < 2048 else "medium" if budget < 8192 else "high"
    return chat


def _wants_cache(body: dict[str, Any]) -> bool:
    return '"cache_control"' in json.dumps(body)


def chat_to_message(result: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion as an Anthropic Message. Input is reported as Anthropic does:
    ``input_tokens`` without the cache reads and writes; a prompt that marks a
    ``cache_control`` breakpoint writes its uncached part to the cache."""
    choice = result["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = {}
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": arguments,
            }
        )
    finish = choice.get("finish_reason")
    stop = {"length": "max_tokens", "tool_calls": "tool_use"}.get(finish, "end_turn")
    usage = result["usage"]
    prompt = usage["prompt_tokens"]
    read = usage["prompt_tokens_details"]["cached_tokens"]
    write = prompt - read if _wants_cache(body) else 0
    return {
        "id": "msg_" + result["id"].removeprefix("chatcmpl-sim-"),
        "type": "message",
        "role": "assistant",
        "model": result["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt - read - write,
            "cache_creation_input_tokens": write,
            "cache_read_input_tokens": read,
            "output_tokens": usage["completion_tokens"],
        },
    }


def message_events(message: dict[str, Any]) -> list[Event]:
    """Anthropic's stream events for a complete Message."""
    usage = message["usage"]
    start_usage = {**usage, "output_tokens": 1}
    start = {**message, "content": [], "stop_reason": None, "usage": start_usage}
    events: list[Event] = [("message_start", {"message": start}), ("ping", {})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                (
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            for piece in _chunks(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                events.append(("content_block_delta", {"index": index, "delta": delta}))
        else:
            opened = {**block, "input": {}}
            events.append(("content_block_start", {"index": index, "content_block": opened}))
            for piece in _chunks(json.dumps(block["input"])):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(("content_block_delta", {"index": index, "delta": delta}))
        events.append(("content_block_stop", {"index": index}))
    last: dict[str, Any] = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(
        ("message_delta", {"delta": last, "usage": {"output_tokens": usage["output_tokens"]}})
    )
    events.append(("message_stop", {}))
    return [(name, {"type": name, **data}) for name, data in events]


def count_message_tokens(model: SimulatedModel, body: dict[str, Any]) -> dict[str, Any]:
    """``/v1/messages/count_tokens``: the prompt's tokens as the simulator counts them."""
    chat = messages_to_chat(body)
    if not chat["messages"]:
        raise SimulatorRequestError("'messages' must be a non-empty array")
    tokens, _ = model._prompt_tokens(chat, chat["messages"])
    return {"input_tokens": tokens}


# ---------------------------------------------------------------------------- embeddings


def embed(seed: int, model_name: str, body: dict[str, Any]) -> dict[str, Any]:
    """Seeded unit vectors: the same text always gets the same vector (for one seed)."""
    inputs = body.get("input")
    if isinstance(inputs, str) or (
        isinstance(inputs, list) and inputs and all(isinstance(t, int) for t in inputs)
    ):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise SimulatorRequestError("'input' must be text, a list of texts, or token ids")
    dims = body.get("dimensions") or DEFAULT_DIMENSIONS
    if not isinstance(dims, int) or not 1 <= dims <= 4096:
        raise SimulatorRequestError("'dimensions' must be from 1 to 4096")
    as_base64 = body.get("encoding_format") == "base64"
    data, tokens = [], 0
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            text, tokens = item, tokens + count_tokens(item)
        elif isinstance(item, list) and all(isinstance(t, int) for t in item):
            text, tokens = json.dumps(item), tokens + len(item)
        else:
            raise SimulatorRequestError(f"input[{index}] is neither text nor token ids")
        vector = _vector(seed, text, dims)
        value: Any = vector
        if as_base64:
            value = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": value})
    return {
        "object": "list",
        "data": data,
        "model": model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _vector(seed: int, text: str, dims: int) -> list[float]:
    raw = b""
    block = 0
    while len(raw) < dims * 4:
        raw += hashlib.sha256(f"{seed}:embed:{block}:{text}".encode()).digest()
        block += 1
    values = [(int.from_bytes(raw[i * 4 : i * 4 + 4], "big") / 2**31) - 1.0 for i in range(dims)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]
