"""The gateway's client for its one upstream.

:class:`HttpUpstream` speaks HTTP/1.1 to an ``http://`` or ``https://`` base URL: a pool of
keep-alive connections, each request written in one piece, responses parsed by httptools
and read as they arrive (a stream is forwarded chunk by chunk). It does what the gateway
needs and nothing else: no redirects, cookies, proxies or retries (a POST that may have
reached the upstream is never sent twice). :class:`AsgiUpstream` calls an in-process ASGI
app instead (the built-in simulator, tests).

Every failure is an :class:`UpstreamError`; ``sent`` says whether the request may have
reached the upstream (then the call is charged its reservation).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools
import httpx

from holedger.errors import ConfigError
from holedger.gateway.wire import ASGIApp

CONNECT_TIMEOUT_S = 10.0
# Below the 5 s after which common servers (uvicorn, Node) drop an idle connection, so a
# request is rarely written into a connection the server is closing.
KEEPALIVE_EXPIRY_S = 4.0
MAX_CONNECTIONS = 512
MAX_IDLE_CONNECTIONS = 128
# A slow reader (a client reading a stream slowly) pauses the upstream socket beyond this.
READ_HIGH_WATER = 256 << 10
READ_LOW_WATER = 64 << 10
CHAT_PATH = "/chat/completions"


class UpstreamError(Exception):
    """The upstream could not be used. ``kind`` names what failed (``ConnectError``,
    ``ReadTimeout``, ``RemoteProtocolError``...); ``sent`` is False only when the request
    certainly never reached the upstream."""

    def __init__(self, kind: str, detail: str, *, sent: bool) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.sent = sent


class UpstreamResponse(Protocol):
    """What the gateway reads from an upstream answer."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    async def post(
        self, body: bytes, path: str = CHAT_PATH, headers: Sequence[tuple[str, str]] = ()
    ) -> UpstreamResponse:
        """Send one request to ``path`` under the base URL, with ``headers`` added to the
        upstream's own; the body is read from the answer."""
        ...

    async def aclose(self) -> None: ...


def upstream_headers(api_key: str | None, provider: str = "openai") -> list[tuple[str, str]]:
    """The headers every upstream request carries (the client's token is never among them):
    the key as the provider takes it (``x-api-key`` for Anthropic, a bearer token else)."""
    headers = [
        ("content-type", "application/json"),
        ("accept", "application/json"),
        ("accept-encoding", "identity"),
    ]
    if api_key and provider == "anthropic":
        headers.append(("x-api-key", api_key))
    elif api_key:
        headers.append(("authorization", f"Bearer {api_key}"))
    return headers


# ---------------------------------------------------------------------------- HTTP/1.1


class HttpUpstream:
    """Keep-alive HTTP/1.1 to ``{base_url}{path}`` (``/chat/completions`` by default)."""

    def __init__(
        self,
        base_url: str,
        headers: list[tuple[str, str]],
        *,
        timeout_s: float,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        max_idle: int = MAX_IDLE_CONNECTIONS,
        keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
    ) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"upstream URL {base_url!r} is not an http(s) URL")
        if parts.username is not None or parts.password is not None:
            raise ConfigError(
                "the upstream URL carries credentials",
                hint="name the key's environment variable in upstream_api_key_env instead",
            )
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self._prefix = parts.path or ""
        self._query = "?" + parts.query if parts.query else ""
        self._netloc = parts.netloc
        self._headers = list(headers)
        self._heads: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
        self._head = self._request_head(CHAT_PATH, ())
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self.max_idle = max_idle
        self._slots: asyncio.Semaphore | None = None
        self._max_connections = max_connections
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = None

    def _request_head(self, path: str, extra: tuple[tuple[str, str], ...]) -> bytes:
        """The request line and headers up to the content length, made once per path."""
        head = self._heads.get((path, extra))
        if head is not None:
            return head
        target = self._prefix + path + self._query
        lines = [f"POST {target} HTTP/1.1", f"host: {self._netloc}"]
        lines += [f"{name}: {value}" for name, value in (*self._headers, *extra)]
        # A header that could split the request is refused (a configuration error when
        # it comes from the configuration).
        if any(c in line for line in lines for c in "\r\n\0"):
            raise ConfigError("an upstream header or URL contains a line break")
        head = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")
        if len(self._heads) < 64:
            self._heads[(path, extra)] = head
        return head

    async def post(
        self, body: bytes, path: str = CHAT_PATH, headers: Sequence[tuple[str, str]] = ()
    ) -> UpstreamResponse:
        head = (
            self._head
            if path == CHAT_PATH and not headers
            else (self._request_head(path, tuple(headers)))
        )
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_connections)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise UpstreamError("PoolTimeout", "no upstream connection free", sent=False) from exc
        try:
            conn = self._idle_connection() or await self._connect()
        except BaseException:
            self._slots.release()
            raise
        # From here the response holds the slot and gives it back when it is done.
        response = conn.request(head + str(len(body)).encode() + b"\r\n\r\n" + body)
        return await response.start()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _idle_connection(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.idle_since < self.keepalive_expiry_s:
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if self.tls:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            context = self._ssl
        conn = _Connection(self, self.timeout_s)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await loop.create_connection(
                    lambda: conn,
                    self.host,
                    self.port,
                    ssl=context,
                    server_hostname=self.host if context is not None else None,
                )
        except TimeoutError as exc:
            raise UpstreamError("ConnectTimeout", f"{self.host}:{self.port}", sent=False) from exc
        except (OSError, ssl.SSLError) as exc:
            raise UpstreamError("ConnectError", str(exc), sent=False) from exc
        return conn

    def _release(self, conn: _Connection, reuse: bool) -> None:
        """A response is done with its connection: keep it for the next request or close."""
        assert self._slots is not None
        self._slots.release()
        if reuse and conn.reusable and len(self._idle) < self.max_idle:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()


class _Connection(asyncio.Protocol):
    """One upstream connection; carries one response at a time."""

    def __init__(self, pool: HttpUpstream, timeout_s: float) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.response: _HttpResponse | None = None

    @property
    def reusable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def request(self, data: bytes) -> _HttpResponse:
        assert self.transport is not None
        self.response = _HttpResponse(self)
        self.transport.write(data)
        return self.response

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            response.fail("RemoteProtocolError", "the upstream switched protocols")
            self.close()
        except httptools.HttpParserError as exc:
            response.fail("RemoteProtocolError", f"bad response: {exc}")
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if response.started and response.until_eof:
                response.on_message_complete()  # a body delimited by the connection's end
            else:
                detail = f"connection lost: {exc}" if exc else "the upstream closed the connection"
                response.fail("RemoteProtocolError" if exc is None else "ReadError", detail)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # httptools callbacks: forwarded to the response being read

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.response is not None and self.response.complete:
            self.closed = True  # a second answer to one request: do not reuse
        elif self.response is not None:
            self.response.on_headers_complete(
                self.parser.get_status_code(), self.parser.should_keep_alive()
            )

    def on_body(self, body: bytes) -> None:
        if self.response is not None and not self.response.complete:
            self.response.on_body(body)

    def on_message_complete(self) -> None:
        if self.response is not None and not self.response.complete:
            self.response.on_message_complete()


class _HttpResponse:
    """An upstream answer as it arrives: headers first, then body chunks."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status_code = 0
        self.headers: dict[str, str] = {}
        self.started = False  # headers are in
        self.complete = False  # the whole message is in
        self.until_eof = False  # no length given: the body ends with the connection
        self._keep_alive = False
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._released = False
        self._decoder: zlib._Decompress | None = None

    # fed by the connection

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self, status: int, keep_alive: bool) -> None:
        if 100 <= status < 200:
            self._raw_headers = []  # an informational answer: the real one follows
            return
        self.status_code = status
        self.headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self._raw_headers
        }
        self._keep_alive = keep_alive
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self.until_eof = "content-length" not in self.headers and not chunked
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "deflate"):
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # either header
        elif encoding not in ("identity", ""):
            self.fail("DecodingError", f"unsupported content-encoding {encoding!r}")
            return
        self.started = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._decoder is not None:
            try:
                body = self._decoder.decompress(body)
            except zlib.error as exc:
                self.fail("DecodingError", str(exc))
                return
            if not body:
                return
        self._chunks.append(body)
        self._buffered += len(body)
        if not self._paused and self._buffered > READ_HIGH_WATER:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.started:
            return  # the end of an informational answer
        self.complete = True
        self._wake()

    def fail(self, kind: str, detail: str) -> None:
        if self._error is None and not self.complete:
            self._error = UpstreamError(kind, detail, sent=True)
            self._conn.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    async def _wait(self) -> None:
        """Until something arrives, or the read timeout (then the response fails)."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(self._conn.timeout_s, _expire, waiter)
        try:
            timed_out = await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if timed_out and self._error is None and not self.complete:
            self._error = UpstreamError("ReadTimeout", "the upstream went silent", sent=True)
            self._conn.close()

    # read by the gateway

    async def start(self) -> _HttpResponse:
        """Wait for the status line and headers."""
        try:
            while not self.started:
                if self._error is not None:
                    raise self._error
                await self._wait()
        except BaseException:
            self._release(reuse=False)
            raise
        return self

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            if self._chunks:
                # Everything that has arrived, in one piece: a stream's events go on in
                # one write instead of one per HTTP chunk.
                if len(self._chunks) == 1:
                    chunk = self._chunks.popleft()
                else:
                    chunk = b"".join(self._chunks)
                    self._chunks.clear()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < READ_LOW_WATER:
                    self._paused = False
                    self._conn.resume_reading()
                yield chunk
            elif self._error is not None:
                self._release(reuse=False)
                raise self._error
            elif self.complete:
                if self._decoder is not None:
                    tail = self._decoder.flush()
                    self._decoder = None
                    if tail:
                        self._chunks.append(tail)
                        continue
                self._release(reuse=self._keep_alive)
                return
            else:
                await self._wait()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        # Unread body left: the connection cannot carry another request.
        self._release(reuse=self.complete and not self._chunks and self._keep_alive)

    def _release(self, reuse: bool) -> None:
        if self._released:
            return
        self._released = True
        reuse = reuse and self._error is None
        if reuse:
            self._conn.response = None
        self._conn.pool._release(self._conn, reuse)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)


# ---------------------------------------------------------------------------- in-process


class _AsgiResponse:
    """An httpx response from an in-process app, failures as :class:`UpstreamError`."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.headers: Mapping[str, str] = response.headers

    async def aread(self) -> bytes:
        try:
            return await self._response.aread()
        except httpx.HTTPError as exc:
            raise UpstreamError(type(exc).__name__, str(exc), sent=True) from exc

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(type(exc).__name__, str(exc), sent=True) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


class AsgiUpstream:
    """Calls an in-process ASGI app (the simulator) as if it were the upstream."""

    def __init__(self, app: ASGIApp, headers: list[tuple[str, str]], timeout_s: float) -> None:
        self._transport = httpx.ASGITransport(app=app)
        self._headers = [(k.encode(), v.encode()) for k, v in headers]
        self._timeouts = {
            "connect": CONNECT_TIMEOUT_S,
            "read": timeout_s,
            "write": timeout_s,
            "pool": timeout_s,
        }

    async def post(
        self, body: bytes, path: str = CHAT_PATH, headers: Sequence[tuple[str, str]] = ()
    ) -> UpstreamResponse:
        extra = [(k.encode(), v.encode()) for k, v in headers]
        request = httpx.Request(
            "POST",
            httpx.URL("http://simulator/v1" + path),
            headers=[*self._headers, *extra, (b"content-length", str(len(body)).encode())],
            content=body,
            extensions={"timeout": self._timeouts},
        )
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            raise UpstreamError(type(exc).__name__, str(exc), sent=not never_sent) from exc
        return _AsgiResponse(response)

    async def aclose(self) -> None:
        await self._transport.aclose()
