"""Which upstream serves a call: models routed to upstreams, each speaking its provider's formats.

Each configured upstream (``[gateway.upstreams.NAME]``) has a provider (``openai``,
``anthropic``, ``openai-compatible``, ``simulator``), its own key (read from the
environment variable it names, sent as that provider takes it, never to a sandbox) and
the models routed to it. A model no upstream lists goes to the default upstream (the one
that lists no models), if there is one. A call is forwarded only to an upstream whose
provider speaks the call's wire format; nothing is translated between formats.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from holedger.gateway.config import GatewayConfig, UpstreamConfig
from holedger.gateway.denial import Denial
from holedger.gateway.formats.base import WireFormat
from holedger.gateway.upstream import (
    AsgiUpstream,
    HttpUpstream,
    Upstream,
    UpstreamResponse,
    upstream_headers,
)
from holedger.gateway.wire import ASGIApp

Poster = Callable[[bytes], Awaitable[UpstreamResponse]]


@dataclass(frozen=True)
class Route:
    name: str
    provider: str
    upstream: Upstream

    def poster(self, fmt: WireFormat, headers: Sequence[tuple[str, str]]) -> Poster:
        path, upstream = fmt.upstream_path, self.upstream
        extra = tuple(headers)

        def post(body: bytes) -> Awaitable[UpstreamResponse]:
            return upstream.post(body, path, extra)

        return post


def make_upstream(config: UpstreamConfig, app: ASGIApp | None) -> Upstream:
    """The client for one configured upstream (``app`` in-process instead, for tests)."""
    headers = upstream_headers(config.api_key(), config.provider)
    if app is None and config.simulator:
        from holedger.gateway.sim_server import create_simulator_app

        app = create_simulator_app(seed=config.simulator_seed)
    if app is not None:
        return AsgiUpstream(app, headers, config.timeout_s)
    assert config.base_url is not None
    return HttpUpstream(config.base_url, headers, timeout_s=config.timeout_s)


class Router:
    """The configured upstreams and the model routes to them."""

    def __init__(self, config: GatewayConfig, upstream_app: ASGIApp | None = None) -> None:
        configs = config.upstreams or (config.upstream,)
        self.routes: dict[str, Route] = {}
        self._by_model: dict[str, Route] = {}
        self._default: Route | None = None
        for up in configs:
            route = Route(up.name, up.provider, make_upstream(up, upstream_app))
            self.routes[up.name] = route
            if up.models is None:
                self._default = route
            else:
                for model in up.models:
                    self._by_model.setdefault(model, route)

    def route(self, model: str, fmt: WireFormat) -> Route:
        route = self._by_model.get(model, self._default)
        if route is None:
            raise Denial(
                400,
                "invalid_request_error",
                "no_upstream",
                f"no upstream is configured for model {model!r}",
                param="model",
            )
        if route.provider not in fmt.providers:
            raise Denial(
                400,
                "invalid_request_error",
                "format_not_served",
                f"{fmt.path} is not served for model {model!r}: its upstream "
                f"{route.name!r} ({route.provider}) does not speak this format",
                param="model",
            )
        return route

    async def aclose(self) -> None:
        for route in self.routes.values():
            await route.upstream.aclose()
