"""A real OpenAI-compatible upstream: base URL and a key from a named environment variable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.errors import ConfigError
from holedger.gateway.config import GatewayConfig
from holedger.gateway.serve import AppServer
from holedger.gateway.wire import Receive, Scope, Send

from .helpers import SIM_MODEL, CountingUpstream, close_env, make_terms, open_env


class HeaderSpy(CountingUpstream):
    def __init__(self) -> None:
        super().__init__()
        self.auth: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.auth += [v for k, v in scope["headers"] if k == b"authorization"]
        await super().__call__(scope, receive, send)


@pytest.fixture
def spy_server() -> Iterator[tuple[HeaderSpy, AppServer]]:
    spy = HeaderSpy()
    server = AppServer(spy).start()
    yield spy, server
    server.stop()


def test_upstream_gets_its_own_key_never_the_trial_token(
    tmp_path: Path, spy_server: tuple[HeaderSpy, AppServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    spy, server = spy_server
    monkeypatch.setenv("HOLEDGER_TEST_UPSTREAM_KEY", "sk-upstream-secret")
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        "[gateway]\n"
        f'upstream_base_url = "{server.base_url}"\n'
        'upstream_api_key_env = "HOLEDGER_TEST_UPSTREAM_KEY"\n'
        "default_max_tokens = 77\n"
        'max_tokens_field = "max_tokens"\n'
    )
    config = GatewayConfig.load(config_file)
    env = open_env(f"sqlite:///{tmp_path / 'l.db'}", make_terms(), config)
    try:
        token = env.trial_token()
        sdk = openai.OpenAI(base_url=env.base_url, api_key=token, max_retries=0)
        sdk.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "x"}])
        assert spy.auth == [b"Bearer sk-upstream-secret"]
        assert spy.bodies[0]["max_tokens"] == 77
        assert token.encode() not in repr(spy.bodies).encode()
    finally:
        close_env(env)


def test_a_missing_key_variable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOLEDGER_TEST_NO_SUCH_KEY", raising=False)
    config = GatewayConfig.from_mapping(
        {
            "upstream_base_url": "http://127.0.0.1:9/v1",
            "upstream_api_key_env": "HOLEDGER_TEST_NO_SUCH_KEY",
        }
    )
    with pytest.raises(ConfigError) as info:
        config.upstream.api_key()
    assert "HOLEDGER_TEST_NO_SUCH_KEY" in info.value.one_line()


@pytest.mark.parametrize(
    "table",
    [
        {"upstream_base_url": "http://x/v1", "aliases": {"gpt-*": "m"}},
        {"upstream_base_url": "http://x/v1", "unknown_setting": 1},
        {"upstream_base_url": "http://x/v1", "event_linger_s": 60},
        {},
    ],
)
def test_bad_configurations_are_refused(table: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        GatewayConfig.from_mapping(table)


def test_simulator_upstream_by_configuration() -> None:
    config = GatewayConfig.from_mapping({"upstream": "simulator", "simulator_seed": 3})
    assert config.upstream.simulator and config.upstream.simulator_seed == 3


@pytest.mark.parametrize(
    ("body", "setting"),
    [
        ('upstream = "simulator"\ndefault_max_tokens = "lots"', "default_max_tokens = 'lots'"),
        ('upstream = "simulator"\nmax_body_bytes = 1.5', "max_body_bytes = 1.5"),
        ('upstream = "simulator"\noptimizer_models = "gpt-4.1"', "optimizer_models = 'gpt-4.1'"),
        ('upstream = "simulator"\naliases = ["gpt-4.1"]', "aliases = ['gpt-4.1']"),
        ('upstream = "simulator"\nevent_linger_s = 60', "event_linger_s = 60"),
        ('upstream = "simulator"\nupstream_timeout_s = "10"', "upstream_timeout_s = '10'"),
        ('upstrem_base_url = "http://x/v1"', "upstrem_base_url is not a gateway setting"),
        ('upstream_base_url = "ftp://x/v1"', "upstream_base_url = 'ftp://x/v1'"),
        ('upstream = "sim"', "upstream = 'sim'"),
        ("default_max_tokens = 10", "[gateway] names no upstream"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_file_and_the_setting(
    tmp_path: Path, body: str, setting: str
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f"[gateway]\n{body}\n")
    with pytest.raises(ConfigError) as info:
        GatewayConfig.load(path)
    line = info.value.one_line()
    assert line.startswith(f"{path}: {setting}"), line
    assert "\n" not in line and info.value.hint, line


def test_an_upstream_url_with_credentials_is_refused_without_echoing_them(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[gateway]\nupstream_base_url = "https://me:s3cret@example.com/v1"\n')
    with pytest.raises(ConfigError) as info:
        GatewayConfig.load(path)
    line = info.value.one_line()
    assert line.startswith(f"{path}: upstream_base_url carries credentials"), line
    assert "s3cret" not in line and "upstream_api_key_env" in line


def test_serve_says_where_its_gateway_settings_are_and_which_is_bad(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert CliRunner().invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    shown = CliRunner().invoke(cli, ["--home", str(home), "serve", "--help"])
    assert "HOME/gateway.toml" in " ".join(shown.output.split()), shown.output
    (home / "gateway.toml").write_text('[gateway]\nupstream = "simulator"\nevent_backlog = 0\n')
    argv = ["--home", str(home), "serve", "--port", "0", "--gateway-port", "0"]
    result = CliRunner().invoke(cli, argv, prog_name="holedger")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"holedger: error: {home / 'gateway.toml'}: event_backlog = 0")
    assert "(hint: " in lines[0]


def test_an_unset_upstream_key_names_the_setting_and_the_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HOLEDGER_TEST_UPSTREAM_KEY", raising=False)
    config = GatewayConfig.from_mapping(
        {
            "upstream_base_url": "http://127.0.0.1:9/v1",
            "upstream_api_key_env": "HOLEDGER_TEST_UPSTREAM_KEY",
        }
    )
    with pytest.raises(ConfigError) as info:
        config.upstream.api_key()
    assert "HOLEDGER_TEST_UPSTREAM_KEY" in info.value.message
    assert "upstream_api_key_env" in info.value.message
    assert info.value.hint is not None and "gateway.toml" in info.value.hint
