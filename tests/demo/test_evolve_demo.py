"""`holedger demo --protocol solve-evolve`: the demo task as a small solve-evolve run,
offline, with the example evolver in its sandbox; the run and its NONE run verify."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.runs import replay_run
from holedger.schemas.events import StepClosed


@pytest.mark.slow
def test_a_small_solve_evolve_demo_runs_offline_and_verifies(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = CliRunner().invoke(
        cli,
        [
            "--home",
            str(home),
            "demo",
            "--protocol",
            "solve-evolve",
            "--batch",
            "3",
            "--steps",
            "2",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads(result.stdout)
    assert summary["verified"] is True and summary["failures"] == []
    assert (summary["steps"], summary["batch"]) == (2, 3)
    ledger = Ledger.from_settings(Settings.resolve(home))
    try:
        run_id = summary["run_id"]
        opened = ledger.run_terms(run_id)
        terms = opened.solve_evolve
        assert terms is not None and terms.none_run is not None
        assert terms.scope == ["harness/"]  # corpus/ is immutable
        closed = [
            StepClosed.model_validate(r.payload)
            for r in ledger.records(run_id)
            if r.type == "StepClosed"
        ]
        # the evolver commits an edit after a step with a failed case, else nothing
        assert [c.step for c in closed] == [1, 2]
        assert summary["commits"] == sum(c.outcome == "committed" for c in closed)
        j, base = Fraction(summary["j_exact"]), Fraction(summary["base_exact"])
        assert base == terms.none_run.j and Fraction(summary["delta_exact"]) == j - base
        for rid in (run_id, terms.none_run.run_id):
            report = replay_run(ledger, rid)
            assert report.verified, [c for c in report.checks if not c.ok]
            assert {c.name for c in report.checks} >= {"evolve_steps", "in_situ"}
    finally:
        ledger.close()
