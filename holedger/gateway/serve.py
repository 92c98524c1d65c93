"""Running an ASGI app (the gateway, or the simulator) on uvicorn: TCP and unix sockets.

Sandboxes reach the gateway through a unix socket bind-mounted into them. A running
:class:`AppServer` can open one more unix socket per trial (:meth:`AppServer.bind_unix`);
the gateway then knows which trial is calling on it, and refuses any other trial's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import uvicorn

from holedger.errors import ConfigError
from holedger.gateway.app import CallerBinding, Gateway
from holedger.gateway.wire import ASGIApp

SWITCH_INTERVAL_S = 0.0005


class AppServer:
    """uvicorn serving ``app`` on TCP ``host:port`` and/or a unix socket ``uds``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str | None = "127.0.0.1",
        port: int | None = 0,
        uds: str | Path | None = None,
    ) -> None:
        self.app = app
        self.sockets: list[socket.socket] = []
        self.urls: list[str] = []
        if host is not None and port is not None:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
            self.port = int(sock.getsockname()[1])
            self.sockets.append(sock)
            self.urls.append(f"http://{host}:{self.port}/v1")
        if uds is not None:
            self.sockets.append(_unix_socket(str(uds)))
            self.urls.append(f"unix:{uds}")
        if not self.sockets:
            raise ConfigError("nothing to listen on", hint="give a TCP port or a unix socket")
        if isinstance(app, Gateway):
            # The event writer thread runs Python code (signing, encoding); let the event
            # loop take the GIL back within 0.5 ms instead of the default 5 ms.
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            _freeze_startup_objects()
        config = uvicorn.Config(
            app,
            lifespan="on",
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # nothing here reads the client's address
            http="httptools" if _has("httptools") else "h11",
            loop="uvloop" if _has("uvloop") else "asyncio",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._extra: dict[str, asyncio.base_events.Server] = {}

    @property
    def base_url(self) -> str:
        return self.urls[0]

    def run(self) -> None:
        """Serve in the foreground until interrupted."""
        self.server.run(sockets=self.sockets)

    def start(self) -> AppServer:
        """Serve in a background thread; returns once the server is accepting."""

        def target() -> None:
            factory = self.server.config.get_loop_factory()
            loop = factory() if factory is not None else asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.server.serve(sockets=self.sockets))
            finally:
                # the loop's own descriptors (epoll, eventfd, io_uring, its wake-up pipe)
                # stay open until garbage collection unless it is closed here
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=target, name="holedger-asgi", daemon=True)
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise ConfigError("the server failed to start")
            self._thread.join(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(15)
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ per-trial sockets

    def bind_unix(self, path: str | Path, binding: CallerBinding) -> None:
        """Open a unix socket at ``path`` on which only ``binding``'s token is accepted."""
        if not isinstance(self.app, Gateway):
            raise ConfigError("per-trial sockets are a gateway feature")
        if self._loop is None:
            raise ConfigError("the server is not running", hint="call start() first")
        self.app.bind(str(path), binding)
        future = asyncio.run_coroutine_threadsafe(self._open_unix(str(path)), self._loop)
        future.result(10)

    def unbind_unix(self, path: str | Path) -> None:
        key = str(path)
        if self._loop is not None and key in self._extra:
            server = self._extra.pop(key)

            def close() -> None:
                server.close()  # connections already open finish their calls
                if server in self.server.servers:
                    self.server.servers.remove(server)

            with contextlib.suppress(RuntimeError):  # stopped: the loop closed its servers
                self._loop.call_soon_threadsafe(close)
        if isinstance(self.app, Gateway):
            self.app.unbind(key)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(key)

    async def _open_unix(self, path: str) -> None:
        config = self.server.config
        state = self.server.server_state
        app_state: dict[str, Any] = self.server.lifespan.state

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state=app_state
            )

        sock = _unix_socket(path)
        server = await asyncio.get_running_loop().create_unix_server(protocol, sock=sock)
        self._extra[path] = server
        self.server.servers.append(server)


_frozen = False


def _freeze_startup_objects() -> None:
    """Once per process: move what exists at start (modules, the ledger, the app) out of
    the garbage collector's sight. A full collection otherwise walks every object of the
    process and stops the gateway for tens of milliseconds; afterwards it walks only what
    was made since."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


def _has(module: str) -> bool:
    """Whether an optional speed-up (uvloop, httptools) is installed."""
    return importlib.util.find_spec(module) is not None


def _unix_socket(path: str) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        raise ConfigError(f"cannot listen on unix socket {path}: {exc.strerror}") from exc
    os.chmod(path, 0o666)  # the sandbox user must be able to connect
    return sock


def serve_gateway(
    app: Gateway,
    *,
    host: str | None = "127.0.0.1",
    port: int | None = 0,
    uds: str | Path | None = None,
    background: bool = True,
) -> AppServer:
    """Serve the gateway on TCP and/or a unix socket; in a thread unless ``background`` is
    False (then this blocks until interrupted)."""
    server = AppServer(app, host=host, port=port, uds=uds)
    if background:
        return server.start()
    server.run()
    return server
