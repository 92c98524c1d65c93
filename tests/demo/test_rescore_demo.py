"""`holedger rescore RUN --times 2` through the CLI on the bundled task: a closed run's
nominee is scored again twice; replay verifies each re-scoring run (its `rescoring` check
passes, and fails once a re-scoring's binding is re-signed to name another tree), and
`analysis bands` shows b_t derived from the two pairs beside the task's band parameter,
worked by hand from the recorded scores.

The run is on officeqa-lite as a campaign runs it with `test_cases = 4`
(demo/campaign_tasks.py): the bundled task's seed harness (the openai SDK, in a real
sandbox), simulator, verifier and K = 3, with its test split cut to 4 cases, so that the
seed baseline, the run's held-out scoring and two re-scorings are 48 trials, not 576."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from ledger.attacker import Attacker, resign_run

from holedger.config import Settings
from holedger.demo.campaign_tasks import derived_task
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
TASK_ID = "officeqa-lite-test4"


def _holedger(home: Path, *args: str, ok: tuple[int, ...] = (0,)) -> Any:
    proc = subprocess.run(
        [sys.executable, "-m", "holedger", "--home", str(home), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert proc.returncode in ok, proc.stderr[-3000:] + proc.stdout[-3000:]
    return json.loads(proc.stdout)


def _scored(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """The run's signed RunScored payload, as recorded."""
    [scored] = [r.payload for r in ledger.records(run_id) if r.type == "RunScored"]
    return dict(scored)


def test_rescore_through_the_cli_verifies_and_derives_the_band(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _holedger(home, "init")
    task = derived_task(Settings.resolve(home), "officeqa-lite", 4)
    opened = _holedger(
        home,
        "run",
        "open",
        "--task",
        str(task),
        "--optimizer",
        "o",
        "--model",
        "m",
        "--harness",
        "h",
    )
    run_id = opened["run_id"]
    _holedger(home, "nominate", run_id, "seed")  # held-out scored and closed
    out = _holedger(home, "rescore", run_id, "--times", "2")["rescorings"]
    assert [r["index"] for r in out] == [1, 2]

    settings = Settings.resolve(home)
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        run = _scored(ledger, run_id)
        again = [_scored(ledger, r["run_id"]) for r in out]
        opened = [ledger.run_terms(r["run_id"]) for r in out]
    finally:
        ledger.close()
    # each re-scoring scored the run's nominee (the same tree), K = 3 on the 4 test cases
    for scored, terms in zip(again, opened, strict=True):
        assert terms.rescore_of is not None and terms.rescore_of.run_id == run_id
        assert terms.rescore_of.candidate == run["candidate"]
        assert int(scored["k"]) == 3 and len(scored["per_case"]) == 4
    e1 = Fraction(run["e_h_plus"])
    e0 = Fraction(run["e_h0"])
    e2 = [Fraction(s["e_h_plus"]) for s in again]
    assert [Fraction(r["e_h_plus"]) for r in out] == e2  # the CLI says what was signed
    assert e0 < 1

    for r in out:
        report = _holedger(home, "replay", r["run_id"])
        assert report["verified"] is True, report["failures"]
        checks = {c["name"]: c["ok"] for c in report["checks"]}
        assert checks["rescoring"] is True and checks["scores"] is True
        assert report["rescoring"]["run_id"] == run_id

    # b_t by hand: each re-scoring pairs with the run, |E1 - E2| / (1 - E(H0)); the median
    # of two is their mean; K = 3 attempts, so no sqrt(k'/3) factor
    d = [abs(e1 - e) / (1 - e0) for e in e2]
    by_hand = (d[0] + d[1]) / 2
    bands = _holedger(home, "analysis", "bands")
    [task_row] = [t for t in bands["tasks"] if t["task"] == TASK_ID]
    assert (task_row["rescorings"], task_row["rescored_runs"]) == (2, 1)
    assert task_row["band_from_rescorings"] == pytest.approx(float(by_hand), abs=1e-12)
    assert Fraction(task_row["band_parameter_exact"]) == Fraction(1, 20)
    assert bands["rescorings_left_out"] == []
    plain = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a pipe: plain lines
    shown = subprocess.run(
        [sys.executable, "-m", "holedger", "--home", str(home), "analysis", "bands"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env=plain,
    ).stdout
    lines = shown.splitlines()
    assert lines[1].split("\t")[:4] == ["task", "band", "from re-scorings", "pairs"], shown
    row = next(line.split("\t") for line in lines if line.startswith(TASK_ID + "\t"))
    # the parameter and the derived band side by side, and the number of pairs
    assert row[1:4] == ["0.050", f"{float(by_hand):.3f}", "2"], shown

    # a key holder re-signs the second re-scoring so that its binding names another tree
    # than the nominee's: replay's rescoring check fails, then passes again once restored
    attacker = Attacker(settings.ledger_url)
    victim = out[1]["run_id"]
    rows = attacker.rows(victim)

    def rebind(etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        if etype != "RunOpened":
            return payload
        return {**payload, "rescore_of": {**payload["rescore_of"], "tree": "0" * 40}}

    forged = resign_run(rows, SigningKey.load(settings.key_path), edit=rebind)
    try:
        for row, raw in zip(rows, forged, strict=True):
            attacker.set_state(victim, row.version, raw)
        report = _holedger(home, "replay", victim, ok=(1,))
        failed = {c["name"] for c in report["checks"] if not c["ok"]}
        assert "rescoring" in failed, report["failures"]
        reasons = [f["reason"] for f in report["failures"] if f["check"] == "rescoring"]
        assert any("not the tree 000000000000" in r for r in reasons), report["failures"]
    finally:
        attacker.restore(victim, rows)
        attacker.close()
    assert _holedger(home, "replay", victim)["verified"] is True
