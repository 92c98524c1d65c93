"""An audit's steps given the wrong things from the command line: an open run, an unknown
run or audit, the run's server key as the auditor's, and another auditor's key on an
audit it did not open. Each is one line on stderr with a hint, exit 2, and nothing is
appended: the audit still verifies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from replay_protocol.runs import RunWriter, honest_finish, honest_search, terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.schemas.events import OptimizerDescriptor

SEED = "a" * 40


@pytest.fixture
def home(tmp_path: Path) -> dict[str, Any]:
    cfg = Settings.resolve(tmp_path / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    d = OptimizerDescriptor(model="m", harness="oc", harness_scope="common")
    closed = RunWriter(ledger, terms(seed_commit=SEED), descriptor=d)
    honest_search(closed, SEED, "1" * 40)
    honest_finish(closed, "1" * 40)
    still_open = RunWriter(ledger, terms(seed_commit=SEED), descriptor=d)
    honest_search(still_open, SEED, "2" * 40)
    ledger.close()
    keys = {}
    for name in ("mine", "theirs"):
        keys[name] = str(tmp_path / f"{name}.key")
        result = CliRunner().invoke(cli, ["audit", "key", "new", keys[name]])
        assert result.exit_code == 0, result.output
    return {
        "home": str(tmp_path / "home"),
        "closed": closed.run_id,
        "open": still_open.run_id,
        "keys": keys,
        "server_key": str(cfg.key_path),
    }


def _run(home: dict[str, Any], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--home", home["home"], *args])
    return result.exit_code, result.stdout, result.stderr


def _refused(home: dict[str, Any], needle: str, *args: str) -> None:
    code, out, err = _run(home, *args)
    assert code == 2, (out, err)
    assert needle in err and "(hint: " in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _audits(home: dict[str, Any]) -> list[dict[str, Any]]:
    code, out, _ = _run(home, "audit", "list", "--json")
    assert code == 0
    got = json.loads(out)
    return list(got["audits"] if isinstance(got, dict) else got)


def test_opening_an_audit_of_the_wrong_thing_records_nothing(home: dict[str, Any]) -> None:
    mine = home["keys"]["mine"]
    _refused(home, "is open", "audit", "open", home["open"], "--key", mine)
    _refused(
        home, "is the server key", "audit", "open", home["closed"], "--key", home["server_key"]
    )
    _refused(home, "not a run id", "audit", "open", "no-such-run", "--key", mine)
    _refused(home, "no such key file", "audit", "open", home["closed"], "--key", mine + ".gone")
    assert _audits(home) == []


def test_another_auditors_key_cannot_append_to_an_audit(home: dict[str, Any]) -> None:
    mine, theirs = home["keys"]["mine"], home["keys"]["theirs"]
    code, out, err = _run(home, "audit", "open", home["closed"], "--key", mine, "--json")
    assert code == 0, err
    audit = json.loads(out)["audit_id"]
    finding = ["--category", "benchmark_threshold", "--evidence", "harness.py:3"]
    _refused(
        home, "is not the auditor key", "audit", "finding", "add", audit, *finding, "--key", theirs
    )
    _refused(home, "is not the auditor key", "audit", "hda", audit, "--key", theirs)
    _refused(
        home,
        "is not the auditor key",
        *("audit", "neutralize", audit, "--from", home["home"], "--key", theirs),
    )
    code, out, _ = _run(home, "audit", "show", audit, "--json")
    assert code == 0 and json.loads(out)["findings"] == []
    code, out, _ = _run(home, "audit", "verify", audit)
    assert code == 0, out  # nothing was appended that would not verify
    # the key that opened it adds its finding, and the audit still verifies
    code, _, err = _run(home, "audit", "finding", "add", audit, *finding, "--key", mine)
    assert code == 0, err
    code, out, _ = _run(home, "audit", "verify", audit)
    assert code == 0, out
    _refused(home, "no audit", "audit", "show", "no-such-audit")
