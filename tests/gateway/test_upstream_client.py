"""The gateway's HTTP/1.1 upstream client against a raw TCP server that answers exactly as
each test scripts it: keep-alive, chunked and close-delimited bodies, gzip, informational
answers, and upstreams that refuse, go silent, cut a body short or answer twice."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from holedger.gateway.config import GatewayConfig, UpstreamConfig
from holedger.gateway.upstream import HttpUpstream, UpstreamError

from .helpers import SIM_MODEL, close_env, make_terms, open_env

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
MESSAGES = [{"role": "user", "content": "hello"}]
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": SIM_MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}


class RawServer:
    """A TCP server on its own thread and loop; ``handler`` serves each connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.Server | None = None
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def start() -> None:
                self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
                ready.set()

            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def close() -> None:
            assert self.server is not None
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(close(), self.loop)
        self.thread.join(5)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def answer(body: bytes, *headers: str, length: bool = True) -> bytes:
    head = ["HTTP/1.1 200 OK", "content-type: application/json", *headers]
    framed = any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers)
    if length and not framed:
        head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.fixture
def raw_server() -> Iterator[Callable[[Handler], RawServer]]:
    servers: list[RawServer] = []

    def make(handler: Handler) -> RawServer:
        servers.append(RawServer(handler))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def post(url: str, body: bytes = b"{}", timeout_s: float = 10.0, calls: int = 1) -> list[bytes]:
    """``calls`` sequential requests through one client; their bodies."""

    async def go() -> list[bytes]:
        client = HttpUpstream(url, [("content-type", "application/json")], timeout_s=timeout_s)
        try:
            out = []
            for _ in range(calls):
                resp = await client.post(body)
                out.append(await resp.aread())
                await resp.aclose()
            return out
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_one_connection_carries_many_requests_each_written_whole(
    raw_server: Callable[[Handler], RawServer],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            server.requests.append(await read_request(reader))
            writer.write(answer(b'{"n": %d}' % len(server.requests)))
            await writer.drain()

    server = raw_server(handler)
    bodies = post(server.base_url, b'{"x": 1}', calls=5)
    assert bodies == [b'{"n": %d}' % i for i in range(1, 6)]
    assert server.connections == 1
    head = server.requests[0].split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"post /v1/chat/completions http/1.1")
    assert f"host: 127.0.0.1:{server.port}".encode() in head
    assert server.requests[0].endswith(b'\r\n\r\n{"x": 1}')


def test_chunked_close_delimited_and_gzip_bodies_are_read_whole(
    raw_server: Callable[[Handler], RawServer],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        kind = len(server.requests)
        server.requests.append(b"")
        if kind == 0:
            body = chunked(b'{"a":', b" 1}")
            writer.write(answer(body, "transfer-encoding: chunked", "connection: close"))
        elif kind == 1:
            packed = gzip.compress(b'{"b": 2}')
            writer.write(answer(packed, "content-encoding: gzip", "connection: close"))
        else:
            # Neither length nor chunking: the body ends with the connection.
            writer.write(answer(b'{"c": 3}', "connection: close", length=False))
            await writer.drain()
            writer.close()
            return
        await writer.drain()

    server = raw_server(handler)
    assert post(server.base_url, calls=3) == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}']


def test_an_informational_answer_is_skipped(raw_server: Callable[[Handler], RawServer]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + answer(b'{"ok": 1}'))
        await writer.drain()

    server = raw_server(handler)
    assert post(server.base_url) == [b'{"ok": 1}']


def test_a_refused_connection_was_never_sent() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: the connection is refused
        with pytest.raises(UpstreamError) as info:
            post(f"http://127.0.0.1:{port}/v1")
    assert info.value.kind == "ConnectError" and not info.value.sent


@pytest.mark.parametrize("cut", ["before_answer", "mid_body", "silent"])
def test_an_upstream_that_breaks_off_may_have_done_the_work(
    raw_server: Callable[[Handler], RawServer], cut: str
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if cut == "mid_body":
            writer.write(answer(b'{"partial"', "content-length: 100"))
            await writer.drain()
        elif cut == "silent":
            await asyncio.sleep(5)
        writer.close()

    server = raw_server(handler)
    with pytest.raises(UpstreamError) as info:
        post(server.base_url, timeout_s=0.5)
    assert info.value.sent
    assert info.value.kind == ("ReadTimeout" if cut == "silent" else "RemoteProtocolError")


def test_a_connection_the_upstream_closed_while_idle_is_not_reused(
    raw_server: Callable[[Handler], RawServer],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"{}"))  # keep-alive answer, then the server drops the connection
        await writer.drain()

    server = raw_server(handler)

    async def go() -> None:
        client = HttpUpstream(server.base_url, [], timeout_s=5)
        for _ in range(3):
            resp = await client.post(b"{}")
            assert await resp.aread() == b"{}"
            await resp.aclose()
            await asyncio.sleep(0.1)  # the close reaches the client before the next call
        await client.aclose()

    asyncio.run(go())
    assert server.connections == 3


def test_a_second_answer_to_one_request_poisons_the_connection(
    raw_server: Callable[[Handler], RawServer],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(answer(b'{"n": 1}') + answer(b'{"smuggled": 1}'))
            await writer.drain()

    server = raw_server(handler)
    assert post(server.base_url, calls=2) == [b'{"n": 1}', b'{"n": 1}']
    assert server.connections == 2  # the answered-twice connection was dropped


def test_a_large_stream_read_slowly_arrives_whole(
    raw_server: Callable[[Handler], RawServer],
) -> None:
    parts = [bytes([65 + i % 26]) * 50_000 for i in range(40)]  # 2 MB: reading pauses

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(chunked(*parts), "transfer-encoding: chunked"))
        await writer.drain()

    server = raw_server(handler)

    async def go() -> bytes:
        client = HttpUpstream(server.base_url, [], timeout_s=10)
        resp = await client.post(b"{}")
        got = []
        async for chunk in resp.aiter_raw():
            got.append(chunk)
            await asyncio.sleep(0.001)
        await resp.aclose()
        await client.aclose()
        return b"".join(got)

    assert asyncio.run(go()) == b"".join(parts)


def test_credentials_in_the_upstream_url_are_refused() -> None:
    from holedger.errors import ConfigError

    with pytest.raises(ConfigError):
        HttpUpstream("http://user:secret@127.0.0.1:1/v1", [], timeout_s=1)


# ---------------------------------------------------------------------------- via the gateway


def test_the_gateway_charges_a_cut_answer_its_reservation_and_a_refused_one_nothing(
    raw_server: Callable[[Handler], RawServer], tmp_path: Path
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = json.dumps(COMPLETION).encode()
        writer.write(answer(body[:20], f"content-length: {len(body)}"))
        await writer.drain()

    server = raw_server(handler)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        for url, charged in ((server.base_url, True), (refused, False)):
            config = GatewayConfig(upstream=UpstreamConfig(base_url=url))
            env = open_env(f"sqlite:///{tmp_path / f'{charged}.db'}", make_terms(), config)
            try:
                sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
                with pytest.raises(openai.APIStatusError) as info:
                    sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES)
                assert info.value.status_code == 502
                # final: the upstream may have done (and billed) the work already
                assert info.value.response.headers["x-should-retry"] == "false"
                (event,) = env.calls()
                assert event.status == 502 and event.reason is not None
                if charged:
                    assert event.usage_estimated and event.tokens.total == event.reserved > 0
                    assert "RemoteProtocolError" in event.reason
                else:
                    assert not event.usage_estimated and event.tokens.total == 0
                    assert "ConnectError" in event.reason
            finally:
                close_env(env)


def test_the_gateway_streams_a_chunked_upstream_answer_and_meters_it(
    raw_server: Callable[[Handler], RawServer], tmp_path: Path
) -> None:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": SIM_MODEL}
    events = [
        {**base, "choices": [{"index": 0, "delta": {"content": "he"}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "llo"}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": COMPLETION["usage"]},
    ]
    sse = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write((head + "transfer-encoding: chunked\r\n\r\n").encode())
        for event in sse:  # cut mid-event, to be put back together by the gateway
            for piece in (event[:7], event[7:]):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await asyncio.sleep(0.002)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server = raw_server(handler)
    config = GatewayConfig(upstream=UpstreamConfig(base_url=server.base_url))
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), config)
    try:
        sdk = openai.OpenAI(base_url=env.base_url, api_key=env.trial_token(), max_retries=0)
        chunks = list(sdk.chat.completions.create(model=SIM_MODEL, messages=MESSAGES, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "hello"
        assert all(c.choices for c in chunks)  # the usage chunk was not asked for: hidden
        (event,) = env.calls()
        assert event.stream and not event.usage_estimated
        assert (event.tokens.input, event.tokens.output, event.tokens.total) == (5, 1, 6)
    finally:
        close_env(env)


def test_a_stream_the_upstream_breaks_off_ends_with_an_upstream_stream_cut_event(
    raw_server: Callable[[Handler], RawServer], tmp_path: Path
) -> None:
    # As docs/GATEWAY.md's denials table says: the 200 and the first events have gone
    # out, then one SSE error event (upstream_error, upstream_stream_cut) ends the stream,
    # with no [DONE]; the call is recorded as answered and charged its reservation.
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": SIM_MODEL}
    first = {**base, "choices": [{"index": 0, "delta": {"content": "he"}, "finish_reason": None}]}
    event = b"data: " + json.dumps(first).encode() + b"\n\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write((head + "transfer-encoding: chunked\r\n\r\n").encode())
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        writer.close()  # the connection is lost before the stream's end

    server = raw_server(handler)
    config = GatewayConfig(upstream=UpstreamConfig(base_url=server.base_url))
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), config)
    try:
        body = {"model": SIM_MODEL, "messages": MESSAGES, "stream": True}
        headers = {"authorization": f"Bearer {env.trial_token()}"}
        resp = httpx.post(f"{env.base_url}/chat/completions", json=body, headers=headers)
        assert resp.status_code == 200
        events = [e for e in resp.content.split(b"\n\n") if e.strip()]
        assert events[0] == event.strip()
        assert b"[DONE]" not in resp.content
        assert events[-1].startswith(b"data: ")
        error = json.loads(events[-1].removeprefix(b"data: "))["error"]
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_stream_cut")
        assert error["message"].startswith("upstream stream broke: ")
        (call,) = env.calls()
        assert call.allowed and call.status == 200 and call.stream
        assert call.usage_estimated and call.tokens.total == call.reserved > 0
        assert call.reason is not None and call.reason.startswith("upstream stream broke: ")
    finally:
        close_env(env)
