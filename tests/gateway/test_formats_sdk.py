"""The official SDKs, unchanged, against the gateway over real HTTP: the openai Responses
API (plain and streamed, with a function tool), an openai-agents run with a tool, the
anthropic Messages API (plain and streamed, with a tool, and count_tokens), embeddings.
Every call is recorded with the usage the SDK saw, and replay checks the trial's totals."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import openai
import pytest

from holedger.replay.checks.gateway import GatewayFold
from holedger.replay.runs import replay_run
from holedger.schemas.events import GatewayCall

from .helpers import SIM_MODEL, CountingUpstream, Env, trial_completed

CACHE = {"type": "ephemeral"}
QUESTION = "What was the revenue of Acme Corp in Q2 2023?"
PARAMS = {
    "type": "object",
    "properties": {"company": {"type": "string", "description": "the company's name"}},
    "required": ["company"],
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look up a company's annual report.",
    "parameters": PARAMS,
}
ANTHROPIC_TOOL = {
    "name": "lookup",
    "description": "Look up a company's annual report.",
    "input_schema": PARAMS,
}
REPORT = (
    "# Acme Corp: Annual Report 2023\n\n| Quarter | Revenue | Operating costs | Marketing spend |\n"
    "|---|---|---|---|\n| Q1 2023 | 100 | 50 | 10 |\n| Q2 2023 | 120 | 60 | 12 |\n"
)


def openai_client(env: Env, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url, api_key=token, max_retries=4)


def anthropic_client(env: Env, token: str) -> anthropic.Anthropic:
    base = env.base_url.removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key=token, max_retries=4)


def replay_trial(env: Env, trial_id: str = "t1") -> dict[str, Any]:
    """Close the trial as the server would, close the run, and replay it."""
    completed = trial_completed(env, trial_id)
    env.ledger.append(env.run_id, "TrialCompleted", completed, "server")
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
    assert report.verified, report.failed_checks()
    section = report.sections["gateway"]
    assert section["trials_checked"] == 1
    return dict(section)


def answered(env: Env, endpoint: str) -> list[GatewayCall]:
    calls = [c for c in env.ok_calls() if c.endpoint == endpoint]
    assert calls, f"no answered call to {endpoint}"
    return calls


def test_responses_plain_with_a_function_tool(env: Env, upstream: CountingUpstream) -> None:
    sdk = openai_client(env, env.trial_token())
    first = sdk.responses.create(
        model=SIM_MODEL,
        input=QUESTION,
        tools=[RESPONSES_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "lookup"},
        max_output_tokens=400,
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "lookup" and json.loads(call.arguments)["company"] == "Acme Corp"
    second = sdk.responses.create(
        model=SIM_MODEL,
        input=[
            {"role": "user", "content": QUESTION},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "lookup",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": REPORT},
        ],
        tools=[RESPONSES_TOOL],  # type: ignore[list-item]
        max_output_tokens=400,
    )
    assert "120" in second.output_text
    events = answered(env, "/v1/responses")
    assert [e.format for e in events] == ["responses", "responses"]
    for response, event in zip((first, second), events[-2:], strict=True):
        usage = response.usage
        assert usage is not None
        assert event.tokens.input == usage.input_tokens
        assert event.tokens.cached == usage.input_tokens_details.cached_tokens
        assert event.tokens.output == usage.output_tokens
        assert event.tokens.reasoning == usage.output_tokens_details.reasoning_tokens
        assert event.tokens.total == usage.total_tokens
        assert event.reserved >= event.tokens.total and event.max_tokens_imposed is None
    assert upstream.bodies[-1]["max_output_tokens"] == 400
    section = replay_trial(env)
    assert section["target_tokens"]["total"] == sum(c.tokens.total for c in env.calls())


def test_responses_streaming_with_a_function_tool(env: Env) -> None:
    sdk = openai_client(env, env.trial_token())
    seen: list[str] = []
    final = None
    with sdk.responses.stream(
        model=SIM_MODEL,
        input=QUESTION,
        tools=[RESPONSES_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "lookup"},
    ) as stream:
        for event in stream:
            seen.append(event.type)
        final = stream.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in seen
    assert any(item.type == "function_call" for item in final.output)
    [event] = answered(env, "/v1/responses")[-1:]
    assert event.stream and event.format == "responses" and not event.usage_estimated
    assert final.usage is not None and event.tokens.total == final.usage.total_tokens
    assert event.max_tokens_imposed == 1024  # no max_output_tokens: the default imposed
    replay_trial(env)


def test_an_agents_sdk_run_with_a_tool(env: Env) -> None:
    agents = pytest.importorskip("agents")
    looked_up: list[str] = []

    @agents.function_tool
    def lookup(company: str) -> str:
        """Look up a company's annual report.

        Args:
            company: the company's name.
        """
        looked_up.append(company)
        return REPORT

    client = openai.AsyncOpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=4)
    model = agents.OpenAIResponsesModel(model=SIM_MODEL, openai_client=client)
    agent = agents.Agent(
        name="analyst",
        instructions="Answer from the company reports; use the lookup tool.",
        tools=[lookup],
        model=model,
    )
    config = agents.RunConfig(tracing_disabled=True)
    result = asyncio.run(agents.Runner.run(agent, QUESTION, run_config=config, max_turns=4))
    assert looked_up == ["Acme Corp"]
    assert "120" in str(result.final_output)
    events = answered(env, "/v1/responses")
    assert len(events) >= 2 and all(e.format == "responses" for e in events)
    reported = sum(r.usage.total_tokens for r in result.raw_responses)
    assert sum(e.tokens.total for e in events) == reported
    replay_trial(env)


def test_anthropic_messages_plain_with_a_tool(env: Env, upstream: CountingUpstream) -> None:
    sdk = anthropic_client(env, env.trial_token())
    question = {"role": "user", "content": QUESTION}
    first = sdk.messages.create(
        model=SIM_MODEL,
        max_tokens=400,
        messages=[question],  # type: ignore[list-item]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "lookup"},
    )
    assert first.stop_reason == "tool_use"
    [use] = [block for block in first.content if block.type == "tool_use"]
    assert use.input == {"company": "Acme Corp"}
    second = sdk.messages.create(
        model=SIM_MODEL,
        max_tokens=400,
        system=[{"type": "text", "text": "Answer briefly.", "cache_control": CACHE}],
        messages=[
            question,  # type: ignore[list-item]
            {"role": "assistant", "content": first.content},  # type: ignore[dict-item]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": REPORT}],
            },
        ],
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
    )
    assert second.stop_reason == "end_turn" and "120" in second.content[0].text  # type: ignore[union-attr]
    assert second.usage.cache_creation_input_tokens  # a cache breakpoint: a write reported
    events = answered(env, "/v1/messages")
    for message, event in zip((first, second), events[-2:], strict=True):
        u = message.usage
        read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        assert event.format == "messages"
        assert event.tokens.input == u.input_tokens + read + write
        assert (event.tokens.cached, event.tokens.cache_write) == (read, write)
        assert event.tokens.output == u.output_tokens
        assert event.tokens.total == event.tokens.input + u.output_tokens
        assert event.reserved >= event.tokens.total
    assert upstream.bodies[-1]["max_tokens"] == 400
    section = replay_trial(env)
    assert section["target_tokens"]["cache_write"] == second.usage.cache_creation_input_tokens


def test_anthropic_messages_streaming_with_a_tool(env: Env) -> None:
    sdk = anthropic_client(env, env.trial_token())
    kinds: list[str] = []
    with sdk.messages.stream(
        model=SIM_MODEL,
        max_tokens=300,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "lookup"},
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "message_delta" in kinds
    assert any(block.type == "tool_use" for block in final.content)
    [event] = answered(env, "/v1/messages")[-1:]
    assert event.stream and not event.usage_estimated
    u = final.usage
    assert event.tokens.output == u.output_tokens
    assert event.tokens.input == (
        u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
    )
    replay_trial(env)


def test_anthropic_count_tokens_is_metered_recorded_and_costs_nothing(env: Env) -> None:
    sdk = anthropic_client(env, env.trial_token())
    counted = sdk.messages.count_tokens(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
    )
    assert counted.input_tokens > 0
    [event] = env.calls()
    assert event.endpoint == "/v1/messages/count_tokens" and event.format == "count_tokens"
    assert event.allowed and event.status == 200 and not event.usage_estimated
    # It reserves its prompt bound (the forwarded body's bytes: no output), holds the
    # run's first reservation, and is settled at 0 tokens.
    assert event.reservation_index == 0 and event.reserved > counted.input_tokens
    assert event.tokens.total == 0 and event.budget is not None
    sdk.messages.create(
        model=SIM_MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    after = next(c for c in env.calls() if c.endpoint == "/v1/messages")
    assert after.reservation_index == 1 and after.budget is not None
    assert after.budget.settled_calls == 1  # the count is one settled call of the run
    calls = len(env.calls())
    assert replay_trial(env)["calls"] == calls


@pytest.mark.parametrize("encoding", ["float", None])
def test_embeddings_recorded_with_their_usage(
    env: Env, upstream: CountingUpstream, encoding: str | None
) -> None:
    sdk = openai_client(env, env.trial_token())
    texts = ["Acme Corp revenue", "Globex operating costs", "Acme Corp revenue"]
    extra: dict[str, Any] = {"encoding_format": encoding} if encoding else {}
    result = sdk.embeddings.create(model=SIM_MODEL, input=texts, **extra)
    # Unasked, the SDK asks for base64 and decodes it.
    assert upstream.bodies[-1]["encoding_format"] == (encoding or "base64")
    vectors = [d.embedding for d in result.data]
    assert len(vectors) == 3 and len(vectors[0]) == 64
    assert vectors[0] == vectors[2] != vectors[1]  # seeded: the same text, the same vector
    [event] = answered(env, "/v1/embeddings")
    assert event.format == "embeddings" and event.tokens.input == result.usage.prompt_tokens
    assert event.tokens.output == 0 and event.tokens.total == result.usage.total_tokens
    assert event.reserved >= event.tokens.total and event.reservation_index is not None
    replay_trial(env)


def test_mixed_formats_in_one_trial_are_attributed_to_it_and_replayed(env: Env) -> None:
    token = env.trial_token("t1")
    other = env.trial_token("t2")
    oa, an = openai_client(env, token), anthropic_client(env, token)
    oa.chat.completions.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=50
    )
    oa.embeddings.create(model=SIM_MODEL, input="Acme Corp")
    oa.responses.create(model=SIM_MODEL, input=QUESTION, max_output_tokens=50)
    an.messages.create(
        model=SIM_MODEL, max_tokens=50, messages=[{"role": "user", "content": QUESTION}]
    )
    openai_client(env, other).embeddings.create(model=SIM_MODEL, input="not this trial")
    mine = [c for c in env.calls() if c.trial_id == "t1"]
    assert {c.format for c in mine if c.status == 200} == {
        "chat",
        "embeddings",
        "responses",
        "messages",
    }
    usage = env.gateway.trial_usage(env.run_id, "t1")
    assert usage.calls == len(mine)
    assert usage.tokens.total == sum(c.tokens.total for c in mine)
    # The other trial's call is its own; t2 ends too, and replay checks both totals.
    env.ledger.append(env.run_id, "TrialCompleted", trial_completed(env, "t2"), "server")
    completed = trial_completed(env, "t1")
    assert completed.tokens.total == usage.tokens.total
    env.ledger.append(env.run_id, "TrialCompleted", completed, "server")
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
    assert report.verified, report.failed_checks()
    assert report.sections["gateway"]["trials_checked"] == 2


def test_a_trial_reporting_other_cache_writes_fails_replay(env: Env) -> None:
    sdk = anthropic_client(env, env.trial_token())
    sdk.messages.create(
        model=SIM_MODEL,
        max_tokens=50,
        system=[{"type": "text", "text": "Answer briefly.", "cache_control": CACHE}],
        messages=[{"role": "user", "content": QUESTION}],
    )
    completed = trial_completed(env, "t1")
    assert completed.tokens.cache_write > 0
    # Same total, the cache writes moved into plain input: the trial's sum no longer holds.
    forged = completed.tokens.model_copy(update={"cache_write": 0})
    env.ledger.append(
        env.run_id, "TrialCompleted", completed.model_copy(update={"tokens": forged}), "server"
    )
    env.ledger.close_run(env.run_id)
    report = replay_run(env.ledger, env.run_id, checks=[GatewayFold])
    assert report.failed_checks() == ["gateway_trial_totals"]
