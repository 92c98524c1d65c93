"""The official openai SDK, sync and async, streaming and not, against a live gateway."""

from __future__ import annotations

import asyncio

import openai

from holedger.schemas.events import GatewayCall

from .helpers import SIM_MODEL, CountingUpstream, Env

MESSAGES = [
    {"role": "system", "content": "You answer questions about company reports. " * 8},
    {"role": "user", "content": "What was the revenue in 2023?"},
]


def assert_usage_matches(usage: object, event: GatewayCall) -> None:
    assert usage is not None
    assert usage.prompt_tokens == event.tokens.input  # type: ignore[attr-defined]
    assert usage.completion_tokens == event.tokens.output  # type: ignore[attr-defined]
    assert usage.total_tokens == event.tokens.total  # type: ignore[attr-defined]
    details = usage.prompt_tokens_details  # type: ignore[attr-defined]
    assert (details.cached_tokens if details else 0) == event.tokens.cached
    assert event.tokens.total > 0
    assert not event.usage_estimated


def test_sync_non_streaming_usage_equals_recorded_event(env: Env) -> None:
    client = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
    for _ in range(2):  # the second call repeats the prompt prefix: cached tokens, if any
        raw = client.chat.completions.with_raw_response.create(model=SIM_MODEL, messages=MESSAGES)
        completion = raw.parse()
        assert completion.choices[0].message.content
        event = env.by_id(raw.headers["x-holedger-call-id"])
        assert_usage_matches(completion.usage, event)
        assert event.allowed and event.status == 200 and event.trial_id == "t1"
        assert event.model_requested == event.model_served == SIM_MODEL
        assert event.request_digest and env.ledger.has_blob(event.request_digest)
        assert event.response_digest and env.ledger.has_blob(event.response_digest)


def test_sync_streaming_with_usage_chunk_equals_recorded_event(env: Env) -> None:
    client = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
    stream = client.chat.completions.create(
        model=SIM_MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text
    (event,) = env.ok_calls()
    assert event.stream
    assert_usage_matches(usage, event)


def test_stream_without_include_usage_hides_the_usage_chunk_but_meters_it(
    env: Env, upstream: CountingUpstream
) -> None:
    client = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
    stream = client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, stream=True)
    chunks = list(stream)
    # Client code written for plain streams indexes choices[0]: every chunk must have one.
    assert chunks and all(chunk.choices for chunk in chunks)
    assert all(chunk.usage is None for chunk in chunks)
    (event,) = env.ok_calls()
    assert event.tokens.total > 0 and not event.usage_estimated
    # The gateway asked the upstream for the usage chunk itself.
    assert upstream.bodies[-1]["stream_options"] == {"include_usage": True}


def test_async_client_streaming_and_not(env: Env) -> None:
    async def main() -> tuple[object, object]:
        client = openai.AsyncOpenAI(base_url=env.base_url, api_key=env.trial_token())
        completion = await client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
        stream = await client.chat.completions.create(
            model=SIM_MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        await client.close()
        return completion.usage, usage

    plain_usage, stream_usage = asyncio.run(main())
    plain, streamed = sorted(env.ok_calls(), key=lambda c: c.stream)
    assert_usage_matches(plain_usage, plain)
    assert_usage_matches(stream_usage, streamed)


def test_models_lists_exactly_the_allow_list(env: Env) -> None:
    client = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
    assert sorted(m.id for m in client.models.list()) == sorted([SIM_MODEL, "alias-model"])


def test_default_max_tokens_is_imposed_and_recorded(env: Env, upstream: CountingUpstream) -> None:
    client = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token())
    client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
    client.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, max_tokens=50)
    imposed, given = env.ok_calls()
    default = env.gateway.config.default_max_tokens
    assert imposed.max_tokens_imposed == default
    assert upstream.bodies[0]["max_completion_tokens"] == default
    assert given.max_tokens_imposed is None and "max_completion_tokens" not in upstream.bodies[1]
    assert given.reserved < imposed.reserved
    assert given.reserved >= 50
