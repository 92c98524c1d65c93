"""Harness-updating (per optimizer) and harness-benefit (per target model) from scored runs."""

from __future__ import annotations

import json
from fractions import Fraction as F
from pathlib import Path

from click.testing import CliRunner
from replay_protocol.runs import E_H0, RunWriter, honest_finish, honest_search, terms

from holedger.analysis.capabilities import capabilities
from holedger.analysis.gains import RunGain
from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger

SEED = "a" * 40
CAND = "b" * 40
DIGEST_A, DIGEST_B = "a" * 64, "b" * 64


def _gain(optimizer: str, models: tuple[str, ...], digest: str, e_plus: F, e0: F) -> RunGain:
    return RunGain(
        run_id=f"{optimizer}-{models}-{e_plus}",
        task_id="t",
        task_digest=digest,
        optimizer=optimizer,
        e_h_plus=e_plus,
        e_h0=e0,
        g=None,
        band=F(1, 20),
        budget_used={},
        models=models,
    )


def test_cells_rows_columns_and_spread_are_exact_means() -> None:
    """Two agents (model m1 on digest A, m2 on digest B), three optimizers; o3 has no run on
    m2. Cells average their runs; row and column means average their cells; o3's row and
    m2's column are marked incomplete, and the spread is over complete rows only."""
    a = (("m1",), DIGEST_A)
    b = (("m2",), DIGEST_B)
    runs = [
        _gain("o1", ("m1",), DIGEST_A, F(1, 2), F(1, 4)),  # +1/4
        _gain("o1", ("m1",), DIGEST_A, F(3, 4), F(1, 4)),  # +1/2  -> cell 3/8
        _gain("o1", ("m2",), DIGEST_B, F(1, 2), F(1, 2)),  # 0
        _gain("o2", ("m1",), DIGEST_A, F(1, 4), F(1, 4)),  # 0
        _gain("o2", ("m2",), DIGEST_B, F(2, 3), F(1, 2)),  # +1/6
        _gain("o3", ("m1",), DIGEST_A, F(1, 1), F(1, 4)),  # +3/4
        _gain("seed-baseline", ("m1",), DIGEST_A, F(1, 4), F(1, 4)),  # never counted
    ]
    [table] = capabilities(runs)
    assert table.optimizers == ["o1", "o2", "o3"] and table.agents == [a, b]
    assert table.cell("o1", a) == F(3, 8) and table.cell("o3", b) is None
    assert table.updating("o1") == (F(3, 16), 2, True)  # (3/8 + 0) / 2
    assert table.updating("o2") == (F(1, 12), 2, True)  # (0 + 1/6) / 2
    assert table.updating("o3") == (F(3, 4), 1, False)
    assert table.benefit(a) == ((F(3, 8) + 0 + F(3, 4)) / 3, 3, True)
    assert table.benefit(b) == (F(1, 12), 2, False)  # (0 + 1/6) / 2, o3 missing
    assert table.spread() == F(3, 16) - F(1, 12)  # o3's partial row is left out
    data = table.to_json()
    assert [u["complete"] for u in data["updating"]] == [True, True, False]
    assert data["updating_spread"]["delta_exact"] == "5/48"
    assert data["agents"][0] == {
        "models": ["m1"],
        "task_digest": DIGEST_A,
        "e_h0": "0.25",
        "e_h0_values": ["0.25"],
    }
    assert {c["optimizer"] for c in data["cells"]} == {"o1", "o2", "o3"}


def test_an_agent_whose_runs_pinned_different_baselines_has_no_single_e_h0() -> None:
    """Runs gathered from two homes, each with its own seed-baseline run: the agent's E(H0)
    is not one number, so none is reported as if it were; both values are listed."""
    runs = [
        _gain("o1", ("m1",), DIGEST_A, F(1, 2), F(1, 4)),
        _gain("o2", ("m1",), DIGEST_A, F(1, 2), F(1, 3)),
    ]
    [table] = capabilities(runs)
    [agent] = table.to_json()["agents"]
    assert agent["e_h0"] is None
    assert agent["e_h0_values"] == ["0.25", "1/3"]


def test_two_versions_of_a_task_with_the_same_model_are_two_agents() -> None:
    runs = [
        _gain("o1", ("m1",), DIGEST_A, F(1, 2), F(1, 4)),
        _gain("o1", ("m1",), DIGEST_B, F(1, 2), F(1, 2)),
    ]
    [table] = capabilities(runs)
    assert table.agents == [(("m1",), DIGEST_A), (("m1",), DIGEST_B)]
    assert table.updating("o1") == (F(1, 8), 2, True)


def test_the_command_reads_scored_runs_of_the_ledger(tmp_path: Path) -> None:
    """Two optimizers on two target models (two task digests), one run each, written as
    signed runs and read back by `holedger analysis capabilities`, text and --json."""
    home = tmp_path / "home"
    runner = CliRunner()
    assert runner.invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    ledger = Ledger.from_settings(Settings.resolve(home))
    writers = []
    for optimizer in ("opt-a", "opt-b"):
        for model, digest in (("model-x", "1" * 64), ("model-y", "2" * 64)):
            run_terms = terms(seed_commit=SEED).model_copy(update={"models": [model]})
            writer = RunWriter(ledger, run_terms, task_digest=digest, optimizer=optimizer)
            honest_search(writer, SEED, CAND)
            honest_finish(writer, CAND)
            writers.append(writer)
    ledger.close()
    args = ["--home", str(home), "analysis", "capabilities"]
    result = runner.invoke(cli, [*args, "--json", "--verify"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["runs"] == 4 and data["excluded"] == [] and data["replayed"] is True
    [task] = data["tasks"]
    assert task["optimizers"] == ["opt-a", "opt-b"]
    assert [a["models"] for a in task["agents"]] == [["model-x"], ["model-y"]]
    delta = {(c["optimizer"], c["models"][0]): F(c["delta_exact"]) for c in task["cells"]}
    scored = {}
    check = Ledger.from_settings(Settings.resolve(home))
    for w in writers:
        [rec] = [r for r in check.records(w.run_id) if r.type == "RunScored"]
        opened = check.run_terms(w.run_id)
        scored[(opened.optimizer, opened.terms.models[0])] = F(rec.payload["e_h_plus"]) - E_H0
    check.close()
    assert delta == scored
    text = runner.invoke(cli, args).stdout
    assert "harness-updating" in text and "harness-benefit" in text
    assert "model-x [11111111]" in text and "updating spread (complete rows)" in text
