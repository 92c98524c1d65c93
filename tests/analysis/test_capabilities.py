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
    assert data["source"] == "held-out"
    [grid] = data["grids"]
    assert grid["evolvers"] == ["opt-a", "opt-b"]
    x, y = "model-x [11111111]", "model-y [22222222]"
    assert grid["agents"] == [x, y]
    scored = {}
    check = Ledger.from_settings(Settings.resolve(home))
    for w in writers:
        [rec] = [r for r in check.records(w.run_id) if r.type == "RunScored"]
        opened = check.run_terms(w.run_id)
        label = f"{opened.terms.models[0]} [{opened.task_digest[:8]}]"
        scored[(label, opened.optimizer)] = F(rec.payload["e_h_plus"])
    check.close()
    cells = {(c["agent"], c["evolver"]): F(c["j_exact"]) for c in grid["cells"]}
    assert cells == scored
    assert {b["agent"]: F(b["base_exact"]) for b in grid["base"]} == {x: E_H0, y: E_H0}
    # updating is the mean over both agents, benefit the max over both evolvers
    for u in grid["updating"]:
        e = u["evolver"]
        assert F(u["updating_exact"]) == (scored[x, e] + scored[y, e]) / 2 - E_H0
    for b in grid["benefit"]:
        f = b["agent"]
        assert F(b["benefit_exact"]) == max(scored[f, "opt-a"], scored[f, "opt-b"]) - E_H0
    assert any("held-out score E(H+)" in r for r in grid["readings"])
    text = runner.invoke(cli, args).stdout
    assert "benefit (max)" in text and "updating (mean)" in text
    assert "model-x [11111111]" in text and "regression cells (strictly below NONE)" in text
    assert "source: held-out scores of search runs" in text


GRID = """benchmark,agent,evolver,j
bench,A,NONE,1/2
bench,B,NONE,0.25
bench,A,e1,7/8
bench,A,e2,1/2
bench,B,e1,1/4
bench,B,e2,9/16
bench,B,e3,1/8
"""


def test_a_published_grid_is_read_and_marked_unverified(tmp_path: Path) -> None:
    """A's row lacks e3, so the anchors are agent B and evolvers e1, e2 (complete columns
    over A and B); given anchors A and B with e1 and e2: updating e1 = (3/8 + 0) / 2,
    benefit of B = max(0, 5/16); B x e3 (1/8 < 1/4) regresses, A x e2 and B x e1 tie."""
    path = tmp_path / "grid.csv"
    path.write_text(GRID)
    runner = CliRunner()
    home = ["--home", str(tmp_path / "home")]
    args = [*home, "analysis", "capabilities", "--table", str(path)]
    result = runner.invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].strip().startswith('"unverified_notice": "UNVERIFIED')
    data = json.loads(result.stdout)
    assert data["source"] == "table" and data["verified"] is None
    [grid] = data["grids"]
    assert grid["anchors"] == {"agents": ["B"], "evolvers": ["e1", "e2"], "chosen": "default"}
    given = runner.invoke(
        cli,
        [
            *args,
            "--json",
            "--anchor-agent",
            "A",
            "--anchor-agent",
            "B",
            "--anchor-evolver",
            "e1",
            "--anchor-evolver",
            "e2",
        ],
    )
    [grid] = json.loads(given.stdout)["grids"]
    ups = {u["evolver"]: u.get("updating_exact") for u in grid["updating"]}
    assert ups["e3"] is None and (F(ups["e1"]), F(ups["e2"])) == (F(3, 16), F(5, 32))
    ben = {b["agent"]: (F(b["benefit_exact"]), b["best_evolvers"]) for b in grid["benefit"]}
    assert ben == {"A": (F(3, 8), ["e1"]), "B": (F(5, 16), ["e2"])}
    reg = grid["regressions"]
    assert (reg["regressions"], reg["ties"]) == (1, 2)
    text = runner.invoke(cli, args)
    assert text.exit_code == 0
    assert text.stdout.splitlines()[0].startswith("UNVERIFIED")
    assert "regression cells (strictly below NONE): 1 of 5: B x e3" in text.stdout


def test_bad_grids_and_anchors_are_one_line_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    home = ["--home", str(tmp_path / "home")]
    cases = {
        "agent,evolver\nA,NONE\n": "missing column 'j'",
        "agent,evolver,j\nA,NONE,half\n": "row 2, column 'j': 'half' is not a number",
        "agent,evolver,j\nA,NONE,50\n": "not a pass rate in [0, 1]",
        "agent,evolver,j\nA,e,1/2\nA,e,1/3\n": "row 3: a second cell",
    }
    for n, (body, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{n}.csv"
        path.write_text(body)
        got = runner.invoke(cli, [*home, "analysis", "capabilities", "--table", str(path)])
        assert got.exit_code == 2 and message in got.output, got.output
        assert "Traceback" not in got.output
    good = tmp_path / "good.csv"
    good.write_text(GRID)
    got = runner.invoke(
        cli, [*home, "analysis", "capabilities", "--table", str(good), "--anchor-agent", "Z"]
    )
    assert got.exit_code == 2 and "anchor agent 'Z' has no Base" in got.output
    got = runner.invoke(cli, [*home, "analysis", "capabilities", "--table", str(good), "--verify"])
    assert got.exit_code == 2 and "cannot be verified" in got.output


def test_held_out_grids_leave_out_an_agent_without_one_base() -> None:
    from holedger.analysis.updating_io import grids_from_gains

    runs = [
        _gain("o1", ("m1",), DIGEST_A, F(1, 2), F(1, 4)),
        _gain("o2", ("m1",), DIGEST_A, F(1, 2), F(1, 3)),
        _gain("o1", ("m2",), DIGEST_B, F(3, 4), F(1, 2)),
        _gain("o1", ("m2",), DIGEST_B, F(1, 4), F(1, 2)),
    ]
    [grid], left = grids_from_gains(runs)
    assert grid.source == "held-out"
    assert grid.base == {"m2 [bbbbbbbb]": F(1, 2)}
    assert grid.cells == {("m2 [bbbbbbbb]", "o1"): F(1, 2)}  # the mean of 3/4 and 1/4
    assert left == [("t: m1 [aaaaaaaa]", "its runs pinned 2 E(H0): 1/4, 1/3")]
