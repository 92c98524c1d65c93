"""``holedger serve``: the optimizer API and the model gateway in one process.

The gateway (one per ledger: its token budget state lives in its memory) listens on its
own TCP port and/or unix socket for optimizer-scope calls, and opens one private unix
socket per trial; the API listens on its own. Both share the ledger and the token table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from holedger.config import Settings
from holedger.gateway.app import create_gateway_app
from holedger.gateway.serve import AppServer
from holedger.gateway.tokens import TokenRegistry
from holedger.ledger.store import Ledger
from holedger.server.api import create_api_app
from holedger.server.executor import Executor, make_executor
from holedger.server.gateway_link import GatewayLink, gateway_config
from holedger.server.service import DEFAULT_WORKERS, RunService, ServerConfig


@dataclass
class RunningServer:
    service: RunService
    api: AppServer
    gateway: AppServer
    link: GatewayLink
    executor: Executor

    @property
    def urls(self) -> dict[str, list[str]]:
        api = [u.removesuffix("/v1") if u.startswith("http") else u for u in self.api.urls]
        return {"api": api, "gateway": list(self.gateway.urls)}

    def stop(self) -> None:
        self.api.stop()
        self.gateway.stop()
        self.link.close()
        self.link.gateway.close()
        self.service.close()
        self.executor.close()


def start_server(
    settings: Settings,
    ledger: Ledger,
    *,
    host: str | None = "127.0.0.1",
    port: int | None = 8470,
    socket: Path | None = None,
    gateway_port: int | None = 8471,
    gateway_socket: Path | None = None,
    workers: int = DEFAULT_WORKERS,
    backend: str | None = None,
    executor: str | None = None,
) -> RunningServer:
    """Start the gateway and the API in background threads; returns once both accept.

    ``executor`` names where trials' sandboxes run (:mod:`holedger.server.executor`; None:
    ``HOLEDGER_EXECUTOR``, else local); an unknown one is refused before anything starts.
    """
    trials = make_executor(executor)
    tokens = TokenRegistry(ledger.app.engine)
    gateway = create_gateway_app(ledger, tokens, gateway_config(settings))
    gw_server = AppServer(
        gateway,
        host=host if gateway_port is not None else None,
        port=gateway_port,
        uds=gateway_socket,
    )
    if gateway_port is None and gateway_socket is None:
        raise ValueError("the gateway needs a port or a socket")
    gw_server.start()
    link = GatewayLink(ledger, tokens=tokens, gateway=gateway, server=gw_server)
    service = RunService(
        settings,
        ledger,
        ServerConfig(gateway=link, workers=workers, default_backend=backend, executor=trials),
    )
    api = AppServer(
        create_api_app(service, tokens),
        host=host if port is not None else None,
        port=port,
        uds=socket,
    )
    api.start()
    return RunningServer(service, api, gw_server, link, trials)
