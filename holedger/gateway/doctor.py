"""``holedger doctor``'s gateway part: is each configured upstream usable?

For every upstream of the home's ``gateway.toml`` it asks the provider's model list
(``GET {base_url}/models``, the key sent as that provider takes it): this spends no
tokens. It reports whether the upstream answered, whether the key was accepted, how many
models it lists, and which of the models routed to it it does not list.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from holedger.errors import ConfigError
from holedger.gateway.config import GatewayConfig, UpstreamConfig
from holedger.gateway.formats.anthropic import DEFAULT_VERSION
from holedger.gateway.upstream import upstream_headers
from holedger.output import console, table

CONFIG_NAME = "gateway.toml"
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class UpstreamCheck:
    name: str
    provider: str
    base_url: str | None
    works: bool
    reachable: bool | None
    key_accepted: bool | None
    models_listed: int | None
    routed_missing: list[str]
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def gateway_configuration(home: Path) -> tuple[GatewayConfig, str]:
    """The home's gateway configuration, and where it came from."""
    path = home / CONFIG_NAME
    if path.exists():
        return GatewayConfig.load(path), str(path)
    return GatewayConfig(), "no gateway.toml: the offline simulator"


def check_upstreams(config: GatewayConfig, timeout_s: float = TIMEOUT_S) -> list[UpstreamCheck]:
    return [check_upstream(up, timeout_s) for up in config.upstreams or (config.upstream,)]


def check_upstream(up: UpstreamConfig, timeout_s: float = TIMEOUT_S) -> UpstreamCheck:
    def result(works: bool, detail: str, **known: Any) -> UpstreamCheck:
        fields: dict[str, Any] = {
            "reachable": None,
            "key_accepted": None,
            "models_listed": None,
            "routed_missing": [],
        }
        fields.update(known)
        return UpstreamCheck(up.name, up.provider, up.base_url, works, detail=detail, **fields)

    if up.simulator:
        return result(True, "the offline simulator, in process")
    try:
        key = up.api_key()
    except ConfigError as exc:
        return result(False, exc.message)
    headers = dict(upstream_headers(key, up.provider))
    if up.provider == "anthropic":
        headers["anthropic-version"] = DEFAULT_VERSION
    url = (up.base_url or "").rstrip("/") + "/models"
    try:
        resp = httpx.get(url, headers=headers, timeout=timeout_s, follow_redirects=False)
    except httpx.HTTPError as exc:
        return result(False, f"GET {url} failed: {type(exc).__name__}", reachable=False)
    if resp.status_code in (401, 403):
        return result(
            False,
            f"the upstream refused the key ({resp.status_code})",
            reachable=True,
            key_accepted=False,
        )
    if resp.status_code >= 400:
        return result(
            False, f"GET {url} answered {resp.status_code}", reachable=True, key_accepted=None
        )
    try:
        listed = {m["id"] for m in resp.json()["data"] if isinstance(m, dict) and "id" in m}
    except (ValueError, KeyError, TypeError):
        return result(
            False, "the model list is not in the expected shape", reachable=True, key_accepted=True
        )
    missing = sorted(set(up.models or ()) - listed)
    detail = f"{len(listed)} models listed"
    if missing:
        detail += f"; routed here but not listed: {', '.join(missing)}"
    return result(
        not missing,
        detail,
        reachable=True,
        key_accepted=True,
        models_listed=len(listed),
        routed_missing=missing,
    )


def doctor_section(settings: Any) -> tuple[str, Any, Any]:
    """`holedger doctor`'s upstreams section: its JSON and a function printing its table."""
    config, source = gateway_configuration(settings.home)
    checks = check_upstreams(config)

    def show() -> None:
        rows = [
            [u.name, u.provider, u.base_url or "-", "yes" if u.works else "no", u.detail]
            for u in checks
        ]
        head = ["upstream", "provider", "base URL", "works", "detail"]
        console().print(table(f"gateway upstreams ({source})", head, rows))

    return "upstreams", [c.to_json() for c in checks], show
