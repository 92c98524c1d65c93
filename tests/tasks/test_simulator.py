"""The offline simulator: OpenAI-shaped replies, context-only answers, and the eight levers."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from holedger.gateway.simulator import (
    SimulatedModel,
    SimulatorRequestError,
    SimulatorTransientError,
)
from holedger.tasks import load_task

TASK = load_task("officeqa-lite")
REPORT = (TASK.seed_dir / "corpus" / "amber-software.txt").read_text()
OTHER = (TASK.seed_dir / "corpus" / "iris-optics.txt").read_text()
Q3_2023 = re.search(r"^\| Q3 2023 \| ([0-9,]+) \|", REPORT, re.M).group(1)  # type: ignore[union-attr]
EXPECTED = Q3_2023.replace(",", "")
LOOKUP = "What was the revenue of Amber Software in Q3 2023? Give the amount in USD thousands."
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "find_company_report",
        "description": "Return one company's annual report.",
        "parameters": {
            "type": "object",
            "properties": {"company": {"type": "string", "description": "The company name."}},
            "required": ["company"],
        },
    },
}


def complete(model: SimulatedModel, body: dict[str, Any]) -> dict[str, Any]:
    """A reply, retrying simulated transient errors as a client would."""
    for _ in range(50):
        try:
            return model.complete(body)
        except SimulatorTransientError:
            continue
    raise AssertionError("the simulator failed 50 times in a row")


def ask(question: str, context: str = "", system: str = "", **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": f"{context}\n\n{question}".strip()})
    return {"model": "holedger-sim-1", "messages": messages, **extra}


def content(reply: dict[str, Any]) -> str:
    text = reply["choices"][0]["message"]["content"]
    assert isinstance(text, str)
    return text


def test_any_chat_request_gets_a_generic_openai_shaped_reply() -> None:
    reply = complete(SimulatedModel(), ask("Hello, who are you?"))
    assert reply["object"] == "chat.completion" and reply["model"] == "holedger-sim-1"
    assert "simulator" in content(reply)
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0
    assert SimulatedModel().models() == ["holedger-sim-1"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": [{"content": "x"}]},
        {"messages": "hi"},
        {"messages": [{"role": "wizard", "content": "x"}]},
    ],
)
def test_malformed_requests_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(SimulatorRequestError):
        SimulatedModel().complete(body)


def test_it_calls_a_usable_tool_in_the_openai_format() -> None:
    reply = complete(SimulatedModel(), ask(LOOKUP, tools=[SEARCH_TOOL]))
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "find_company_report"
    assert json.loads(call["function"]["arguments"]) == {"company": "Amber Software"}


def test_it_answers_from_its_context_not_from_an_answer_key() -> None:
    system = "Reply with only the number."
    right = content(complete(SimulatedModel(), ask(LOOKUP, REPORT, system)))
    assert right == EXPECTED
    doctored = REPORT.replace(f"| Q3 2023 | {Q3_2023} |", "| Q3 2023 | 4,321 |")
    assert content(complete(SimulatedModel(), ask(LOOKUP, doctored, system))) == "4321"
    # Without the report in context it can only guess.
    guesses = {
        content(complete(SimulatedModel(seed), ask(LOOKUP, system=system))) for seed in range(5)
    }
    assert EXPECTED not in guesses


def test_a_tool_result_in_the_conversation_is_read() -> None:
    body = ask(LOOKUP, system="Answer with just the number.", tools=[SEARCH_TOOL])
    first = complete(SimulatedModel(), body)
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    body["messages"] += [message, {"role": "tool", "tool_call_id": call["id"], "content": REPORT}]
    assert content(complete(SimulatedModel(), body)) == EXPECTED


def test_a_requested_answer_format_is_followed() -> None:
    final = content(complete(SimulatedModel(), ask(LOOKUP, REPORT, "End with FINAL ANSWER: <n>")))
    assert final.endswith(f"FINAL ANSWER: {EXPECTED}")
    as_json = complete(
        SimulatedModel(), ask(LOOKUP, REPORT, response_format={"type": "json_object"})
    )
    assert json.loads(content(as_json)) == {"answer": EXPECTED}


def test_without_a_format_request_the_reply_format_varies() -> None:
    questions = [c.input["question"] for c in TASK.cases("val")]
    replies = {content(complete(SimulatedModel(), ask(q, REPORT + OTHER))) for q in questions}
    shapes = {r.split()[0] for r in replies}
    assert len(shapes) >= 4


def test_repeated_prompt_prefixes_are_reported_as_cached() -> None:
    model = SimulatedModel()
    body = ask(LOOKUP, REPORT + OTHER, "A long and stable system prompt. " * 20)
    first = complete(model, body)["usage"]
    assert first["prompt_tokens"] > 300
    body["messages"].append({"role": "assistant", "content": "Let me check."})
    second = complete(model, body)["usage"]
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= second["prompt_tokens"]
    assert cached % 64 == 0 and cached >= first["prompt_tokens"] - 64
    # A fresh model has an empty cache.
    fresh = complete(SimulatedModel(), body)["usage"]
    assert fresh["prompt_tokens_details"]["cached_tokens"] == 0


def test_reasoning_effort_costs_tokens_and_prevents_slips() -> None:
    arithmetic = [
        c
        for c in TASK.cases("val") + TASK.cases("test")
        if c.expected["kind"] in ("sum", "difference", "pct_change")
    ]
    corpus = {p.stem: p.read_text() for p in (TASK.seed_dir / "corpus").glob("*.txt")}

    def run(effort: str) -> tuple[int, int]:
        correct = reasoning = 0
        for case in arithmetic:
            question = case.input["question"]
            docs = "\n\n".join(
                t for n, t in corpus.items() if n.replace("-", " ") in question.lower()
            )
            body = ask(question, docs, "Reply with only the number.", reasoning_effort=effort)
            reply = complete(SimulatedModel(), body)
            reasoning += reply["usage"]["completion_tokens_details"]["reasoning_tokens"]
            correct += TASK.verify(case, {"answer": content(reply)}) == 1
        return correct, reasoning

    low, high = run("minimal"), run("high")
    assert high[1] > 3 * max(low[1], 1)
    assert high[0] > low[0]


def test_transient_errors_are_occasional_and_a_retry_is_drawn_afresh() -> None:
    model = SimulatedModel()
    statuses = []
    for case in TASK.cases("val") + TASK.cases("test"):
        try:
            model.complete(ask(case.input["question"]))
            statuses.append(200)
        except SimulatorTransientError as exc:
            statuses.append(exc.status)
            assert exc.status in (500, 502, 503)
            complete(model, ask(case.input["question"]))  # the retry eventually succeeds
    failures = sum(s != 200 for s in statuses)
    assert 0 < failures < len(statuses) // 4


def test_replies_are_deterministic_given_seed_and_body() -> None:
    body = ask(TASK.cases("dev")[3].input["question"], tools=[SEARCH_TOOL])
    a, b = complete(SimulatedModel(7), body), complete(SimulatedModel(7), body)
    assert a == b
    assert a["id"] == b["id"]


def test_max_tokens_truncates_with_finish_reason_length() -> None:
    body = ask(LOOKUP, REPORT, reasoning_effort="high", max_completion_tokens=50)
    reply = complete(SimulatedModel(), body)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] <= 50
