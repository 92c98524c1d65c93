"""The two ends of a trial's way to the gateway when the trial runs on another machine.

Inside the sandbox nothing changes: the harness calls ``127.0.0.1:PORT``, which the
sandbox relays to a unix socket on the node. There, :class:`NodeRelay` takes each
connection over TLS to the server's :class:`TrialFront`, trusting only the certificate
pinned in the trial's plan, and names the trial and its relay secret in a first line.
The front lets the connection through only while the trial runs and only with that
trial's secret, to the trial's own gateway socket, which accepts only the trial's token.
So a node reaches the gateway with per-trial capabilities only, over TLS, and a trial that
has ended is refused at the front.

Both ends run an asyncio loop in a daemon thread of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
import ssl
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from holedger.errors import ConfigError
from holedger.executors.tls import (
    FrontIdentity,
    make_identity,
    pinned_context,
    presented_fingerprint,
    server_context,
)

PREAMBLE = b"HOLEDGER-TRIAL/1 "
PREAMBLE_TIMEOUT_S = 10.0
CHUNK = 1 << 16
T = TypeVar("T")


@dataclass(frozen=True)
class FrontAddress:
    """What a plan carries for a trial's relay: where the front is, its certificate, and
    the trial's relay secret."""

    host: str
    port: int
    cert_pem: bytes
    fingerprint: str
    trial_id: str
    secret: str


class _Loop:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        if not writer.can_write_eof():
            writer.close()


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    try:
        await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))
    finally:
        for writer in (a[1], b[1]):
            writer.close()


def _refusal(code: str, message: str) -> bytes:
    body = json.dumps({"error": {"type": "permission_error", "code": code, "message": message}})
    return (
        f"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}"
    ).encode()


class TrialFront:
    """On the server: a TLS listener that lets a running trial's relay through to that
    trial's gateway socket (see the module's doc)."""

    def __init__(self, host: str, port: int = 0, bind: str | None = None) -> None:
        self.host = host
        self.identity: FrontIdentity = make_identity(host)
        self._routes: dict[str, tuple[Path, str]] = {}
        self._conns: dict[str, set[asyncio.StreamWriter]] = {}
        self._lock = threading.Lock()
        self._loop = _Loop("holedger-front")
        context = server_context(self.identity)
        try:
            self._server = self._loop.call(
                asyncio.start_server(self._serve, bind or host, port, ssl=context)
            )
        except OSError as exc:
            self._loop.stop()
            raise ConfigError(f"cannot listen on {bind or host}:{port}: {exc.strerror}") from exc
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.refused = 0

    def open(self, trial_id: str, gateway_socket: Path) -> FrontAddress:
        """Let ``trial_id``'s relay through to ``gateway_socket`` until :meth:`close`."""
        secret = secrets.token_hex(32)
        with self._lock:
            self._routes[trial_id] = (gateway_socket, secret)
        return FrontAddress(
            self.host,
            self.port,
            self.identity.cert_pem,
            self.identity.fingerprint,
            trial_id,
            secret,
        )

    def close(self, trial_id: str) -> None:
        """The trial ended: refuse its relay from now on and cut what it still holds."""
        with self._lock:
            self._routes.pop(trial_id, None)
            conns = self._conns.pop(trial_id, set())
        for writer in conns:
            self._loop.loop.call_soon_threadsafe(writer.close)

    def stop(self) -> None:
        async def shut() -> None:
            self._server.close()

        with contextlib.suppress(Exception):
            self._loop.call(shut())
        self._loop.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), PREAMBLE_TIMEOUT_S)
        except (TimeoutError, ConnectionError, OSError, ssl.SSLError, ValueError):
            writer.close()
            return
        named = line.removeprefix(PREAMBLE).strip().decode("ascii", "replace")
        trial_id, _, secret = named.partition(" ")
        with self._lock:
            route = self._routes.get(trial_id) if line.startswith(PREAMBLE) else None
            ok = route is not None and hmac.compare_digest(route[1], secret)
        if not ok or route is None:
            self.refused += 1
            writer.write(_refusal("trial_not_running", "no running trial has this relay"))
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            return
        try:
            upstream = await asyncio.open_unix_connection(str(route[0]))
        except OSError:
            self.refused += 1
            writer.write(_refusal("trial_not_running", "the trial's gateway socket is closed"))
            writer.close()
            return
        with self._lock:
            self._conns.setdefault(trial_id, set()).add(writer)
        try:
            await _splice((reader, writer), upstream)
        finally:
            with self._lock:
                self._conns.get(trial_id, set()).discard(writer)


class NodeRelay:
    """On a node: a unix socket for one trial's sandbox, each connection taken to the
    front over TLS with the pinned certificate (see the module's doc)."""

    def __init__(self, path: Path, front: FrontAddress) -> None:
        self.path = path
        self.front = front
        self._context = pinned_context(front.cert_pem)
        self._loop = _Loop("holedger-relay")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        path.chmod(0o666)  # the sandbox's user connects
        self._server = self._loop.call(asyncio.start_unix_server(self._serve, sock=sock))

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()

        with contextlib.suppress(Exception):
            self._loop.call(shut())
        self._loop.stop()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        f = self.front
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(f.host, f.port, ssl=self._context), PREAMBLE_TIMEOUT_S
            )
        except (OSError, TimeoutError, ssl.SSLError):
            writer.close()
            return
        ssl_object = up_writer.get_extra_info("ssl_object")
        if ssl_object is None or presented_fingerprint(ssl_object) != f.fingerprint:
            up_writer.close()
            writer.close()
            return
        up_writer.write(PREAMBLE + f"{f.trial_id} {f.secret}\n".encode("ascii"))
        await _splice((reader, writer), (up_reader, up_writer))
