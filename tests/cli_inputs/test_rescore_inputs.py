"""`holedger rescore` refused (a count out of range, a run it cannot re-score) says only
its one line on stderr: nothing on stdout announces a re-scoring that never starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_protocol.runs import RunWriter, honest_search, terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger


@pytest.mark.parametrize(("times", "needle"), [("0", "--times 0"), ("1", "is not closed")])
def test_a_refused_rescore_says_one_line_and_nothing_else(
    tmp_path: Path, times: str, needle: str
) -> None:
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    writer = RunWriter(ledger, terms(seed_commit="a" * 40))
    honest_search(writer, "a" * 40, "1" * 40)
    ledger.close()
    args = ["--home", str(cfg.home), "rescore", writer.run_id, "--times", times]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""
