"""Gateway configuration: the upstream, aliases, limits.

A configuration file is TOML with a ``[gateway]`` table, for example::

    [gateway]
    upstream_base_url = "https://api.openai.com/v1"
    upstream_api_key_env = "OPENAI_API_KEY"     # the *name* of the variable, never the key
    optimizer_models = ["gpt-4.1"]
    default_max_tokens = 1024

    [gateway.aliases]
    "holedger-sim-1" = "gpt-4.1-mini"

``upstream = "simulator"`` instead of a base URL serves the built-in offline simulator
in-process.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holedger.errors import ConfigError

DEFAULT_MAX_TOKENS = 1024
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_BLOB_CAP_BYTES = 256 << 10
DEFAULT_MEDIA_TOKENS = 2500
# How long the event writer gathers events into one batch. Each batch costs the ledger
# a few milliseconds of CPU whatever its size, so longer batches cost less per call; a
# crash loses the events not yet written (normally this long's worth of answered calls;
# more when the writer cannot keep up).
DEFAULT_EVENT_LINGER_S = 0.05
# At most this many forwarded calls may have events not yet written (what a crash could
# lose); beyond it new calls wait for the writer before they are forwarded.
DEFAULT_EVENT_BACKLOG = 1024


@dataclass(frozen=True)
class UpstreamConfig:
    """Where calls go: an OpenAI-compatible base URL, or the in-process simulator."""

    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 600.0
    simulator: bool = False
    simulator_seed: int = 0

    def api_key(self) -> str | None:
        """The upstream key, read from the named environment variable at start."""
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ConfigError(
                f"environment variable {self.api_key_env} (the upstream key) is not set",
                hint=f"export {self.api_key_env}=... before starting the gateway",
            )
        return value

    def __post_init__(self) -> None:
        if not self.simulator and not self.base_url:
            raise ConfigError(
                "the gateway has no upstream",
                hint='set upstream_base_url, or upstream = "simulator"',
            )


@dataclass(frozen=True)
class GatewayConfig:
    upstream: UpstreamConfig = field(default_factory=lambda: UpstreamConfig(simulator=True))
    aliases: Mapping[str, str] = field(default_factory=dict)
    optimizer_models: tuple[str, ...] | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_tokens_field: str = "max_completion_tokens"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    blob_cap_bytes: int = DEFAULT_BLOB_CAP_BYTES
    media_part_tokens: int = DEFAULT_MEDIA_TOKENS
    event_linger_s: float = DEFAULT_EVENT_LINGER_S
    event_backlog: int = DEFAULT_EVENT_BACKLOG

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> GatewayConfig:
        known = {
            "upstream",
            "upstream_base_url",
            "upstream_api_key_env",
            "upstream_timeout_s",
            "simulator_seed",
            "aliases",
            "optimizer_models",
            "default_max_tokens",
            "max_tokens_field",
            "max_body_bytes",
            "blob_cap_bytes",
            "media_part_tokens",
            "event_linger_s",
            "event_backlog",
        }
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown gateway settings {unknown}", hint="see docs/GATEWAY.md")
        simulator = data.get("upstream") == "simulator"
        if "upstream" in data and not simulator:
            raise ConfigError('upstream must be "simulator" or absent (use upstream_base_url)')
        aliases = dict(data.get("aliases", {}))
        if any("*" in k or "*" in v for k, v in aliases.items()):
            raise ConfigError("model aliases are exact names; wildcards are not allowed")
        opt = data.get("optimizer_models")
        try:
            return cls(
                upstream=UpstreamConfig(
                    base_url=data.get("upstream_base_url"),
                    api_key_env=data.get("upstream_api_key_env"),
                    timeout_s=float(data.get("upstream_timeout_s", 600)),
                    simulator=simulator,
                    simulator_seed=int(data.get("simulator_seed", 0)),
                ),
                aliases=aliases,
                optimizer_models=tuple(opt) if opt is not None else None,
                default_max_tokens=int(data.get("default_max_tokens", DEFAULT_MAX_TOKENS)),
                max_tokens_field=str(data.get("max_tokens_field", "max_completion_tokens")),
                max_body_bytes=int(data.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)),
                blob_cap_bytes=int(data.get("blob_cap_bytes", DEFAULT_BLOB_CAP_BYTES)),
                media_part_tokens=int(data.get("media_part_tokens", DEFAULT_MEDIA_TOKENS)),
                event_linger_s=_linger(data.get("event_linger_s", DEFAULT_EVENT_LINGER_S)),
                event_backlog=_backlog(data.get("event_backlog", DEFAULT_EVENT_BACKLOG)),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad gateway setting: {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> GatewayConfig:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"no gateway configuration at {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"gateway configuration {path} is not TOML: {exc}") from exc
        table = data.get("gateway", {})
        if not isinstance(table, dict):
            raise ConfigError("[gateway] must be a table")
        return cls.from_mapping(table)


def _linger(value: Any) -> float:
    linger = float(value)
    if not 0 <= linger <= 5:
        raise ValueError(f"event_linger_s must be between 0 and 5 seconds, not {value}")
    return linger


def _backlog(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000:
        return value
    raise ValueError(f"event_backlog must be a whole number from 1 to 1000000, not {value!r}")
