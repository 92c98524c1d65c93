"""A Ray executor address that is not ray://HOST:PORT (a port that is not a number or
out of range, an unclosed IPv6 bracket) is one line with a hint, exit 2, before a
campaign makes its home; not an internal error."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.errors import UsageError
from holedger.executors.ray_cluster import parse_url

BAD = ["ray://host:notaport", "ray://host:99999", "ray://[::1", "ray://[::1]", "ray://", "ray:x"]


@pytest.mark.parametrize("url", BAD)
def test_an_address_that_is_not_host_and_port_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_url(url)
    assert "is not ray://HOST:PORT" in err.value.one_line()


def test_good_addresses_parse() -> None:
    assert parse_url("ray://10.0.0.2:6379") == ("10.0.0.2", 6379)
    assert parse_url("ray://[::1]:6379") == ("::1", 6379)


@pytest.mark.parametrize("url", ["ray://host:notaport", "ray://[::1"])
def test_a_campaign_refuses_it_before_making_anything(tmp_path: Path, url: str) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[campaign]\nname = "g1"\ntasks = ["officeqa-lite"]\n[common]\n'
        'harness = "example-greedy"\n[[optimizer]]\nmodel = "m1"\n'
    )
    home = tmp_path / "home"
    args = ["--home", str(home), "campaign", "run", str(grid), "--executor", url]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "is not ray://HOST:PORT" in result.stderr and "(hint: " in result.stderr
    assert not home.exists()
