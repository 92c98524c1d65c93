"""analysis capabilities --in-situ: grids of in-situ pass rates from solve-evolve runs,
worked by hand; never mixed with held-out gains."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from holedger.analysis.insitu import grids_from_ledger
from holedger.analysis.updating import analyse
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger

from .test_evolve_dishonest import _none_run
from .writer import H1, SEED, EvolveWriter


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = Ledger.open(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        SigningKey.generate("insitu-test"),
        checkpoint_interval=16,
    )
    yield led
    led.close()


def _run(ledger: Ledger, optimizer: str, pinned: object, passes: set[int]) -> str:
    w = EvolveWriter(ledger, optimizer=optimizer, none_run=pinned)  # type: ignore[arg-type]
    head = SEED
    for step in (1, 2, 3):
        cases = (2 * step - 2, 2 * step - 1)
        w.solve(step, head, {f"dev-{i}": int(i in passes) for i in cases})
        if step == 1:
            w.commit(H1, SEED, ["harness/prompts/p.txt"])
            w.close_step(1, "committed", SEED, H1)
            head = H1
        else:
            w.close_step(step, "unchanged", head, head)
    w.finish()
    return w.run_id


def test_in_situ_grids_take_j_of_each_run_and_base_of_the_none_run(ledger: Ledger) -> None:
    _, pinned = _none_run(ledger)  # Base = 4/6 = 2/3
    _run(ledger, "evolver-a", pinned, {1, 2, 3, 4, 5})  # J = 5/6
    _run(ledger, "evolver-b", pinned, {1, 2})  # J = 2/6 = 1/3: a regression
    _run(ledger, "evolver-b", pinned, {0, 1, 2, 3})  # J = 4/6: the cell is the mean, 1/2
    left_open = EvolveWriter(ledger, optimizer="evolver-c", none_run=pinned)
    grids, left, used = grids_from_ledger(ledger)
    assert used == 3 and [(r, w) for r, w in left] == [(left_open.run_id, "not closed")]
    (grid,) = grids
    assert grid.source == "in-situ"
    (agent,) = grid.agents
    assert grid.base == {agent: Fraction(2, 3)}
    assert grid.cells == {
        (agent, "evolver-a"): Fraction(5, 6),
        (agent, "evolver-b"): Fraction(1, 2),
    }
    result = analyse(grid)
    # benefit: the max over the evolvers of delta: 5/6 - 2/3 = 1/6 (the mean would be 0)
    assert result["benefit"] == [
        {"agent": agent, "benefit": Fraction(1, 6), "best_evolvers": ["evolver-a"]}
    ]
    # updating of evolver-b: its one agent's delta, 1/2 - 2/3 = -1/6: a regression cell
    updating = {u["evolver"]: u["updating"] for u in result["updating"]}
    assert updating == {"evolver-a": Fraction(1, 6), "evolver-b": Fraction(-1, 6)}
    assert result["regressions"]["regression_cells"] == [{"agent": agent, "evolver": "evolver-b"}]


def test_only_verified_runs_enter_with_verify(ledger: Ledger) -> None:
    _, pinned = _none_run(ledger)
    honest = _run(ledger, "evolver-a", pinned, {1, 2, 3, 4, 5})
    grids, left, used = grids_from_ledger(ledger, verify=True)
    assert used == 1 and left == [] and grids[0].cells
    assert honest


def home_with_a_run(tmp_path: Path) -> Settings:
    """A home whose ledger holds a NONE run (Base 2/3) and one evolved run (J 5/6)."""
    home = Settings.resolve(tmp_path / "home")
    Ledger.init_home(home)
    led = Ledger.from_settings(home)
    try:
        _, pinned = _none_run(led)
        _run(led, "evolver-a", pinned, {1, 2, 3, 4, 5})
    finally:
        led.close()
    return home


def test_the_command_names_its_source_and_never_mixes_it(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from holedger.cli import cli

    home = home_with_a_run(tmp_path)
    runner = CliRunner()
    args = ["--home", str(home.home), "analysis", "capabilities"]
    done = runner.invoke(cli, [*args, "--in-situ", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["source"] == "in-situ" and doc["runs"] == 1
    assert doc["source_detail"].startswith("in-situ pass rates of solve-evolve runs")
    assert [g["source"] for g in doc["grids"]] == ["in-situ"]
    table = tmp_path / "grid.csv"
    table.write_text("agent,evolver,j\nf,NONE,0.5\nf,e,0.75\n")
    mixed = runner.invoke(cli, [*args, "--in-situ", "--table", str(table)])
    assert mixed.exit_code == 2 and "a source of its own" in mixed.output
    held_out = runner.invoke(cli, [*args, "--json"])  # the default: search runs only
    assert json.loads(held_out.stdout)["grids"] == []
