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

Several upstreams, by provider, each with its own key and the models routed to it::

    [gateway.upstreams.openai]
    provider = "openai"                  # base_url defaults to https://api.openai.com/v1
    api_key_env = "OPENAI_API_KEY"
    models = ["gpt-4.1"]

    [gateway.upstreams.claude]
    provider = "anthropic"               # base_url defaults to https://api.anthropic.com/v1
    api_key_env = "ANTHROPIC_API_KEY"
    models = ["claude-sonnet-4-5"]

    [gateway.upstreams.local]
    provider = "openai-compatible"       # vLLM, SGLang, Ollama, OpenRouter, a LiteLLM proxy
    base_url = "http://127.0.0.1:8000/v1"
    # no models: the default route, for every model no other upstream lists
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from holedger.errors import ConfigError
from holedger.gateway.limits import (
    MAX_BODY_BYTES,
    MAX_MEDIA_PART_TOKENS,
    MAX_OUTPUT_TOKENS,
    check_setting,
)

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
PROVIDERS = ("openai", "anthropic", "openai-compatible", "simulator")
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
}
UPSTREAM_SETTINGS = ("provider", "base_url", "api_key_env", "models", "timeout_s", "seed")


@dataclass(frozen=True)
class UpstreamConfig:
    """Where calls go: an OpenAI-compatible base URL, or the in-process simulator."""

    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 600.0
    simulator: bool = False
    simulator_seed: int = 0
    name: str = "default"
    # openai, anthropic, openai-compatible or simulator: which wire formats it speaks
    # and how its key is sent.
    provider: str = "openai-compatible"
    # The models routed to it; None: every model no other upstream lists.
    models: tuple[str, ...] | None = None

    def api_key(self) -> str | None:
        """The upstream key, read from the named environment variable at start."""
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ConfigError(
                f"environment variable {self.api_key_env} (the upstream key, named by "
                "upstream_api_key_env in the gateway configuration) is not set",
                hint=f"export {self.api_key_env}=... before starting the gateway, or name "
                "another variable in HOME/gateway.toml",
            )
        return value

    def __post_init__(self) -> None:
        if self.simulator and self.provider != "simulator":
            object.__setattr__(self, "provider", "simulator")
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
    # Named upstreams by provider ([gateway.upstreams.NAME]); empty: ``upstream`` alone.
    upstreams: tuple[UpstreamConfig, ...] = ()

    def __post_init__(self) -> None:
        # The settings that enter a reservation are bounded however the object is made,
        # so every reservation stays an exact JSON integer (gateway.limits).
        try:
            check_setting("default_max_tokens", self.default_max_tokens, 1, MAX_OUTPUT_TOKENS)
            check_setting("max_body_bytes", self.max_body_bytes, 1, MAX_BODY_BYTES)
            check_setting("blob_cap_bytes", self.blob_cap_bytes, 0, MAX_BODY_BYTES)
            check_setting("media_part_tokens", self.media_part_tokens, 0, MAX_MEDIA_PART_TOKENS)
        except ValueError as exc:
            raise ConfigError(f"gateway setting {exc}") from exc

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str | None = None) -> GatewayConfig:
        """The configuration a ``[gateway]`` table gives; ConfigError, one line naming
        ``source`` (the file) and the offending setting, when it is not a sound one."""
        read = _Reader(data, source)
        unknown = sorted(set(data) - set(SETTINGS))
        if unknown:
            near = difflib.get_close_matches(unknown[0], SETTINGS, n=1)
            raise read.error(
                unknown[0],
                "is not a gateway setting" + (f" (did you mean {near[0]}?)" if near else ""),
                hint=f"the settings are {', '.join(SETTINGS)}; docs/GATEWAY.md describes them",
            )
        upstreams = _upstreams(read, data.get("upstreams"))
        if upstreams and ("upstream" in data or "upstream_base_url" in data):
            raise read.error(
                "upstreams",
                "is given beside upstream/upstream_base_url",
                hint="name every upstream under [gateway.upstreams.NAME], or use the single "
                "upstream settings alone",
            )
        simulator = "upstream" in data
        if simulator and data["upstream"] != "simulator":
            raise read.error(
                "upstream",
                f'= {data["upstream"]!r} is not "simulator"',
                hint='set upstream = "simulator", or give upstream_base_url instead',
            )
        if not simulator and "upstream_base_url" not in data and not upstreams:
            raise read.error(
                None,
                "names no upstream",
                hint='set upstream_base_url, or upstream = "simulator"',
            )
        aliases = read.aliases("aliases")
        if any("*" in k or "*" in v for k, v in aliases.items()):
            raise read.error(
                "aliases",
                "holds a wildcard",
                hint="model aliases are exact names; list each model to alias",
            )
        default = next((u for u in upstreams if u.models is None), None)
        return cls(
            upstream=(default or upstreams[0])
            if upstreams
            else UpstreamConfig(
                base_url=read.url("upstream_base_url"),
                api_key_env=read.text("upstream_api_key_env", None),
                timeout_s=read.number("upstream_timeout_s", 600.0, low=0, low_open=True),
                simulator=simulator,
                simulator_seed=read.whole("simulator_seed", 0, low=0),
            ),
            upstreams=upstreams,
            aliases=aliases,
            optimizer_models=read.models("optimizer_models"),
            default_max_tokens=read.whole(
                "default_max_tokens", DEFAULT_MAX_TOKENS, low=1, high=MAX_OUTPUT_TOKENS
            ),
            max_tokens_field=read.text("max_tokens_field", None) or "max_completion_tokens",
            max_body_bytes=read.whole(
                "max_body_bytes", DEFAULT_MAX_BODY_BYTES, low=1, high=MAX_BODY_BYTES
            ),
            blob_cap_bytes=read.whole(
                "blob_cap_bytes", DEFAULT_BLOB_CAP_BYTES, low=0, high=MAX_BODY_BYTES
            ),
            media_part_tokens=read.whole(
                "media_part_tokens", DEFAULT_MEDIA_TOKENS, low=0, high=MAX_MEDIA_PART_TOKENS
            ),
            event_linger_s=read.number("event_linger_s", DEFAULT_EVENT_LINGER_S, low=0, high=5),
            event_backlog=read.whole("event_backlog", DEFAULT_EVENT_BACKLOG, low=1, high=10**6),
        )

    @classmethod
    def load(cls, path: Path) -> GatewayConfig:
        hint = "fix the file, or remove it to serve the offline simulator"
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"no gateway configuration at {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"gateway configuration {path} is not TOML: {exc}", hint=hint
            ) from exc
        table = data.get("gateway", {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [gateway] is not a table", hint=hint)
        return cls.from_mapping(table, source=str(path))


# Every setting a [gateway] table may hold.
SETTINGS = (
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
    "upstreams",
)


def _upstreams(read: _Reader, tables: Any) -> tuple[UpstreamConfig, ...]:
    """The [gateway.upstreams.NAME] tables, each checked, at most one default route."""
    if tables is None:
        return ()
    if not isinstance(tables, dict) or not tables:
        raise read.error("upstreams", "is not a table of upstream tables")
    out: list[UpstreamConfig] = []
    routed: dict[str, str] = {}
    for name, table in tables.items():
        key = f"upstreams.{name}"
        if not isinstance(table, dict):
            raise read.error(key, "is not a table")
        sub = _Reader(table, f"{read.source}: {key}")
        unknown = sorted(set(table) - set(UPSTREAM_SETTINGS))
        if unknown:
            raise sub.error(
                unknown[0],
                "is not an upstream setting",
                hint=f"an upstream's settings are {', '.join(UPSTREAM_SETTINGS)}",
            )
        provider = table.get("provider")
        if provider not in PROVIDERS:
            raise sub.error(
                "provider",
                f"= {provider!r} is not one of {', '.join(PROVIDERS)}",
            )
        base_url = sub.url("base_url") or DEFAULT_BASE_URLS.get(provider)
        if base_url is None and provider != "simulator":
            raise sub.error("base_url", "is missing", hint=f"give {key}.base_url")
        models = sub.models("models")
        for model in models or ():
            if model in routed:
                raise sub.error(
                    "models",
                    f"routes {model!r}, already routed to {routed[model]!r}",
                    hint="route each model to one upstream",
                )
            routed[model] = name
        out.append(
            UpstreamConfig(
                base_url=None if provider == "simulator" else base_url,
                api_key_env=sub.text("api_key_env", None),
                timeout_s=sub.number("timeout_s", 600.0, low=0, low_open=True),
                simulator=provider == "simulator",
                simulator_seed=sub.whole("seed", 0, low=0),
                name=name,
                provider=provider,
                models=models,
            )
        )
    defaults = [u.name for u in out if u.models is None]
    if len(defaults) > 1:
        raise read.error(
            "upstreams",
            f"has {len(defaults)} default routes ({', '.join(defaults)}: no models listed)",
            hint="list the models of all but one upstream",
        )
    return tuple(out)


class _Reader:
    """Reads the settings of one [gateway] table, each of the type it must have."""

    def __init__(self, data: Mapping[str, Any], source: str | None) -> None:
        self.data = data
        self.source = source or "gateway settings"

    def error(self, key: str | None, problem: str, hint: str | None = None) -> ConfigError:
        where = f"{self.source}: [gateway]" if key is None else f"{self.source}: {key}"
        return ConfigError(
            f"{where} {problem}",
            hint=hint or f"fix {key} under [gateway]; docs/GATEWAY.md describes each setting",
        )

    def _bad(self, key: str, what: str) -> ConfigError:
        return self.error(key, f"= {self.data[key]!r} is not {what}")

    def text(self, key: str, default: str | None) -> str | None:
        value = self.data.get(key, default)
        if value is not None and not (isinstance(value, str) and value):
            raise self._bad(key, "a non-empty string")
        return value

    def url(self, key: str) -> str | None:
        """An http(s) base URL with a host, no credentials and no line breaks (checked
        again where the upstream client is made; here the error can name the file)."""
        value = self.text(key, None)
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.username is not None or parts.password is not None:  # never echoed
            raise self.error(
                key,
                "carries credentials",
                hint="name the key's environment variable in upstream_api_key_env instead",
            )
        try:
            host = parts.hostname
            parts.port  # noqa: B018 - raises ValueError for a port that is not one
        except ValueError:
            host = None
        if parts.scheme not in ("http", "https") or not host or any(c in value for c in "\r\n\0"):
            raise self._bad(key, "an http(s) URL")
        return value

    def whole(self, key: str, default: int, *, low: int, high: int | None = None) -> int:
        value = self.data.get(key, default)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
        if not ok or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise self._bad(key, f"a whole number {span}")
        return int(value)

    def number(
        self,
        key: str,
        default: float,
        *,
        low: float,
        high: float | None = None,
        low_open: bool = False,
    ) -> float:
        value = self.data.get(key, default)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if (
            not number
            or value != value  # NaN
            or value < low
            or (low_open and value == low)
            or (high is not None and value > high)
        ):
            if high is not None:
                span = f"from {low:g} to {high:g}"
            else:
                span = f"above {low:g}" if low_open else f"of at least {low:g}"
            raise self._bad(key, f"a number {span}")
        return float(value)

    def aliases(self, key: str) -> dict[str, str]:
        value = self.data.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
        ):
            raise self._bad(key, "a table of model names to model names")
        return dict(value)

    def models(self, key: str) -> tuple[str, ...] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self._bad(key, "a list of model names")
        return tuple(value)
