"""Upstreams by provider: each model routed to its upstream over real HTTP, each upstream's
own key sent as its provider takes it (the trial's token never leaves the gateway), and
`holedger doctor` checking each configured upstream without spending tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from holedger.errors import ConfigError
from holedger.gateway.config import GatewayConfig
from holedger.gateway.doctor import check_upstreams
from holedger.gateway.serve import AppServer
from holedger.gateway.sim_server import create_simulator_app

from .helpers import SIM_MODEL, close_env, make_terms, open_env

OPENAI_KEY, ANTHROPIC_KEY = "sk-openai-upstream-key", "sk-ant-upstream-key"


class KeyedUpstream:
    """The simulator behind a key check, keeping the headers of every request."""

    def __init__(self, header: str, key: str) -> None:
        self.inner = create_simulator_app()
        self.header, self.key = header.encode(), key.encode()
        self.seen: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.seen.append(headers)
            if headers.get(self.header) != self.key:
                body = b'{"error": {"message": "bad key", "type": "authentication_error"}}'
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": body})
                return
        await self.inner(scope, receive, send)


@pytest.fixture
def upstreams() -> Iterator[tuple[KeyedUpstream, KeyedUpstream, AppServer, AppServer]]:
    oa = KeyedUpstream("authorization", f"Bearer {OPENAI_KEY}")
    an = KeyedUpstream("x-api-key", ANTHROPIC_KEY)
    oa_server, an_server = AppServer(oa).start(), AppServer(an).start()
    yield oa, an, oa_server, an_server
    oa_server.stop()
    an_server.stop()


def two_providers(oa_url: str, an_url: str) -> dict[str, Any]:
    return {
        "upstreams": {
            "openai": {
                "provider": "openai-compatible",
                "base_url": oa_url,
                "api_key_env": "FMT_TEST_OPENAI_KEY",
            },
            "claude": {
                "provider": "anthropic",
                "base_url": an_url,
                "api_key_env": "FMT_TEST_ANTHROPIC_KEY",
                "models": [SIM_MODEL],
            },
        }
    }


def test_each_model_goes_to_its_upstream_with_that_upstreams_key(
    sqlite_url: str,
    upstreams: tuple[KeyedUpstream, KeyedUpstream, AppServer, AppServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    oa, an, oa_server, an_server = upstreams
    monkeypatch.setenv("FMT_TEST_OPENAI_KEY", OPENAI_KEY)
    monkeypatch.setenv("FMT_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)
    config = GatewayConfig.from_mapping(two_providers(oa_server.base_url, an_server.base_url))
    env = open_env(sqlite_url, make_terms(), config)
    try:
        token = env.trial_token()
        claude = anthropic.Anthropic(
            base_url=env.base_url.removesuffix("/v1"), api_key=token, max_retries=4
        )
        message = claude.messages.create(
            model=SIM_MODEL, max_tokens=50, messages=[{"role": "user", "content": "hello"}]
        )
        assert message.type == "message"
        assert an.seen and all(h[b"x-api-key"] == ANTHROPIC_KEY.encode() for h in an.seen)
        # The client's anthropic-version is passed on (this SDK's own, whatever it is).
        sent = claude.default_headers["anthropic-version"]
        assert all(h[b"anthropic-version"] == sent.encode() for h in an.seen)
        # "alias-model" is routed nowhere but the default upstream, an OpenAI-compatible one.
        sdk = openai.OpenAI(base_url=env.base_url, api_key=token, max_retries=4)
        sdk.chat.completions.create(
            model="alias-model", messages=[{"role": "user", "content": "hi"}], max_tokens=20
        )
        assert oa.seen and oa.seen[-1][b"authorization"] == f"Bearer {OPENAI_KEY}".encode()
        # Responses for a model on the Anthropic upstream: not spoken there, not sent.
        before = len(an.seen)
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.responses.create(model=SIM_MODEL, input="hi")
        assert caught.value.code == "format_not_served" and len(an.seen) == before
        seen = [v for h in oa.seen + an.seen for v in h.values()]
        assert not any(token.encode() in v for v in seen)  # the trial's token stays here
    finally:
        close_env(env)


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"upstreams": {"x": {"provider": "bedrock"}}}, "is not one of"),
        ({"upstreams": {"x": {"provider": "openai-compatible"}}}, "base_url is missing"),
        (
            {"upstreams": {"a": {"provider": "openai"}, "b": {"provider": "anthropic"}}},
            "2 default routes",
        ),
        (
            {
                "upstreams": {
                    "a": {"provider": "openai", "models": ["m"]},
                    "b": {"provider": "anthropic", "models": ["m"]},
                }
            },
            "already routed to 'a'",
        ),
        ({"upstream": "simulator", "upstreams": {"a": {"provider": "openai"}}}, "beside"),
        ({"upstreams": {"a": {"provider": "openai", "key": "sk-..."}}}, "not an upstream setting"),
    ],
)
def test_a_bad_upstream_table_is_one_line_naming_it(table: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.from_mapping(table, source="gateway.toml")
    assert problem in caught.value.message and "gateway.toml" in caught.value.message


def test_provider_base_urls_default_to_the_providers_own() -> None:
    config = GatewayConfig.from_mapping(
        {
            "upstreams": {
                "o": {"provider": "openai"},
                "a": {"provider": "anthropic", "models": ["c"]},
            }
        }
    )
    urls = {u.name: u.base_url for u in config.upstreams}
    assert urls == {"o": "https://api.openai.com/v1", "a": "https://api.anthropic.com/v1"}


def test_doctor_checks_each_upstream_without_spending_tokens(
    tmp_path: Path, upstreams: tuple[KeyedUpstream, KeyedUpstream, AppServer, AppServer]
) -> None:
    _, an, oa_server, an_server = upstreams
    table = two_providers(oa_server.base_url, an_server.base_url)
    table["upstreams"]["claude"]["models"] = [SIM_MODEL, "not-served-there"]
    table["upstreams"]["gone"] = {
        "provider": "openai-compatible",
        "base_url": "http://127.0.0.1:9/v1",
        "models": ["elsewhere"],
    }
    lines = ["[gateway]"]
    for name, up in table["upstreams"].items():
        lines.append(f"[gateway.upstreams.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in up.items()]
    home = tmp_path / "home"
    home.mkdir()
    (home / "gateway.toml").write_text("\n".join(lines) + "\n")
    env = {
        **os.environ,
        "FMT_TEST_OPENAI_KEY": "wrong-key",
        "FMT_TEST_ANTHROPIC_KEY": ANTHROPIC_KEY,
    }
    done = subprocess.run(
        [sys.executable, "-m", "holedger", "--home", str(home), "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    checks = {u["name"]: u for u in json.loads(done.stdout)["upstreams"]}
    assert checks["openai"]["reachable"] and checks["openai"]["key_accepted"] is False
    claude = checks["claude"]
    assert claude["key_accepted"] and claude["models_listed"] == 1
    assert claude["routed_missing"] == ["not-served-there"] and not claude["works"]
    assert checks["gone"]["reachable"] is False and not checks["gone"]["works"]
    # Only model lists were asked: nothing was sent to a model.
    assert len(an.seen) == 1


class Broken:
    """An upstream that answers its model list with ``status`` and ``body``."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": self.status, "headers": headers})
            await send({"type": "http.response.body", "body": self.body})


def test_doctor_over_real_http_tells_each_way_an_upstream_can_fail(
    upstreams: tuple[KeyedUpstream, KeyedUpstream, AppServer, AppServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    oa, an, oa_server, an_server = upstreams
    monkeypatch.setenv("FMT_TEST_OPENAI_KEY", OPENAI_KEY)
    monkeypatch.setenv("FMT_TEST_ANTHROPIC_KEY", "sk-ant-wrong")
    down = AppServer(Broken(503, b'{"error": "down"}')).start()
    odd = AppServer(Broken(200, b'{"models": ["not", "a", "list"]}')).start()
    try:
        table = two_providers(oa_server.base_url, an_server.base_url)
        for name, url in (("down", down.base_url), ("odd", odd.base_url)):
            table["upstreams"][name] = {
                "provider": "openai-compatible",
                "base_url": url,
                "models": [f"m-{name}"],
            }
        table["upstreams"]["nokey"] = {
            "provider": "openai",
            "base_url": oa_server.base_url,
            "api_key_env": "FMT_TEST_UNSET_KEY",
            "models": ["m-nokey"],
        }
        monkeypatch.delenv("FMT_TEST_UNSET_KEY", raising=False)
        checks = {c.name: c for c in check_upstreams(GatewayConfig.from_mapping(table))}
    finally:
        down.stop()
        odd.stop()
    good = checks["openai"]
    assert good.works and good.reachable and good.key_accepted and good.models_listed == 1
    assert oa.seen[-1][b"authorization"] == f"Bearer {OPENAI_KEY}".encode()
    claude = checks["claude"]
    assert claude.reachable and claude.key_accepted is False and not claude.works
    assert "401" in claude.detail
    # The Anthropic key goes as x-api-key with a version, never as a bearer token.
    assert an.seen[-1][b"x-api-key"] == b"sk-ant-wrong" and b"anthropic-version" in an.seen[-1]
    assert b"authorization" not in an.seen[-1]
    assert checks["down"].reachable and checks["down"].key_accepted is None
    assert "503" in checks["down"].detail and not checks["down"].works
    assert checks["odd"].key_accepted and not checks["odd"].works
    assert checks["nokey"].reachable is None and "FMT_TEST_UNSET_KEY" in checks["nokey"].detail
    assert len(oa.seen) == 1  # the key-less check sent nothing
