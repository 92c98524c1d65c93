"""analysis bands derives b_t from paired re-scorings (A5), worked by hand, beside the band
parameter; re-scorings that do not pair with their run are left out, each with why.

Task rp-task (K = 2, pinned E(H0) = 1/3, band parameter 1/20). Run A's nominee scores
E = 3/8 (tree T1), run B's 1/2 (tree T2). Re-scorings of A score 5/8 and 5/16, of B 1/2:
|E1 - E2| / (1 - E(H0)) = (1/4, 1/16, 0) / (2/3) = 3/8, 3/32, 0; median 3/32; with K = 2
attempts instead of 3, b_t = 3/32 * sqrt(2/3). g of A is (3/8 - 1/3) / (2/3) = 1/16 and
of B 1/4: both beyond 1/20, so neither is indistinguishable from 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from replay_protocol.runs import RunWriter, terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.schemas.events import OptimizerDescriptor, RescoreOf

SEED = "a" * 40
T1, T2, T9 = "1" * 40, "2" * 40, "9" * 40
MISSING = "4b8f6a2e-1d3c-4e5f-9a7b-0c1d2e3f4a5b"


def _run(ledger: Ledger, candidate: str, tree: str, **opened: Any) -> str:
    writer = RunWriter(ledger, terms(seed_commit=SEED), **opened)
    writer.commit(SEED)
    writer.commit(candidate, tree=tree)
    writer.nominate(candidate)
    writer.heldout(candidate)
    writer.scored(candidate)
    writer.close()
    return writer.run_id


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    home = tmp_path_factory.mktemp("bands") / "home"
    assert CliRunner().invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    ledger = Ledger.from_settings(Settings.resolve(home))
    runs: dict[str, str] = {}
    try:
        for name, cand, tree in (("A", "b" * 40, T1), ("B", "e" * 40, T2)):
            d = OptimizerDescriptor(model=name, harness="oc", harness_scope="common")
            runs[name] = _run(ledger, cand, tree, descriptor=d)

        def rescore(of: str, nominee: str, tree: str, cand: str, scored_tree: str, i: int) -> str:
            bound = RescoreOf(run_id=of, candidate=nominee, tree=tree, index=i)
            return _run(ledger, cand, scored_tree, optimizer="rescore", rescore_of=bound)

        rescore(runs["A"], "b" * 40, T1, "c" * 40, T1, 1)
        rescore(runs["A"], "b" * 40, T1, "d" * 40, T1, 2)
        rescore(runs["B"], "e" * 40, T2, "7" * 40, T2, 1)
        runs["wrong tree"] = rescore(runs["A"], "b" * 40, T1, "f" * 40, T9, 3)
        runs["no run"] = rescore(MISSING, "b" * 40, T1, "c" * 40, T1, 1)
    finally:
        ledger.close()
    return home, runs


def test_the_band_from_paired_rescorings_by_hand(home: tuple[Path, dict[str, str]]) -> None:
    root, runs = home
    result = CliRunner().invoke(cli, ["--home", str(root), "analysis", "bands", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    (task,) = data["tasks"]
    assert task["task"] == "rp-task" and task["band_parameter_exact"] == "0.05"
    assert task["band_from_rescorings"] == pytest.approx(3 / 32 * math.sqrt(2 / 3))
    assert (task["rescorings"], task["rescored_runs"]) == (3, 2)
    assert (task["indistinguishable_from_zero"], task["resolved_from_zero"]) == (0, 2)
    assert sorted(data["rescorings_left_out"], key=lambda x: x["why"]) == [
        {"run": runs["wrong tree"], "why": "it scored another tree than the nominee's it names"},
        {
            "run": runs["no run"],
            "why": f"the run it re-scores, {MISSING}, is not among the runs read",
        },
    ]
    # the re-scorings are not runs of the grid
    grid = json.loads(
        CliRunner().invoke(cli, ["--home", str(root), "analysis", "grid", "--json"]).output
    )
    assert sorted(r["model"] for r in grid["runs"]) == ["A", "B"]


def test_the_text_shows_the_derived_band_beside_the_parameter(
    home: tuple[Path, dict[str, str]],
) -> None:
    root, _ = home
    result = CliRunner().invoke(cli, ["--home", str(root), "analysis", "bands"])
    assert result.exit_code == 0, result.output
    assert f"{3 / 32 * math.sqrt(2 / 3):.3f}" in result.output
    assert "b_t from 3 paired re-scorings" in result.output


def test_a_repeated_index_or_a_rescoring_of_a_rescoring_is_left_out(tmp_path: Path) -> None:
    """Two runs both claiming to be re-scoring 1 of run A would count A's nominee twice
    (the key holder keeping the kinder one too); a re-scoring of a re-scoring pairs two
    re-scorings as if one were the run. Each is left out with why, and nothing pairs."""
    root = tmp_path / "home"
    assert CliRunner().invoke(cli, ["--home", str(root), "init"]).exit_code == 0
    ledger = Ledger.from_settings(Settings.resolve(root))
    try:
        d = OptimizerDescriptor(model="A", harness="oc", harness_scope="common")
        a = _run(ledger, "b" * 40, T1, descriptor=d)
        first, again = (
            _run(
                ledger,
                cand,
                T1,
                optimizer="rescore",
                rescore_of=RescoreOf(run_id=a, candidate="b" * 40, tree=T1, index=1),
            )
            for cand in ("c" * 40, "d" * 40)
        )
        bound = RescoreOf(run_id=first, candidate="c" * 40, tree=T1, index=2)
        nested = _run(ledger, "f" * 40, T1, optimizer="rescore", rescore_of=bound)
    finally:
        ledger.close()
    result = CliRunner().invoke(cli, ["--home", str(root), "analysis", "bands", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    (task,) = data["tasks"]
    assert (task["rescorings"], task["band_from_rescorings"]) == (0, None)
    twice = f"2 runs claim to be re-scoring 1 of run {a}"
    assert sorted(data["rescorings_left_out"], key=lambda x: x["run"]) == sorted(
        [
            {"run": first, "why": twice},
            {"run": again, "why": twice},
            {"run": nested, "why": f"run {first} is itself a re-scoring, not a run with a search"},
        ],
        key=lambda x: x["run"],
    )
