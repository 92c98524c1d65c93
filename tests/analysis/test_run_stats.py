"""Known answers worked by hand for budget use (A14), tokens (A15), optimism (A16) and the
token frontier (A17), and for what a run's facts hold."""

from __future__ import annotations

from fractions import Fraction as F
from pathlib import Path

import pytest
from replay_protocol.runs import RunWriter, honest_finish, honest_search, terms

from holedger.analysis.budget import budget_use, tokens_vs_gain
from holedger.analysis.facts import RunFacts, facts_of
from holedger.analysis.grid import Observation
from holedger.analysis.optimism import frontier, optimism
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger

B = F(5, 100)


def facts(run_id: str, **kw: object) -> RunFacts:
    base: dict[str, object] = {
        "run_id": run_id,
        "task_id": "s",
        "task_digest": "0" * 64,
        "optimizer": "x",
        "e_h_plus": F(1, 2),
        "e_h0": F(1, 4),
        "g": F(1, 3),
        "band": B,
        "budget_used": {},
        "call_limits": {"dev": 100, "val": 100},
        "pass_limits": {"dev": F(4), "val": F(4)},
        "calls": {"dev": 0, "val": 0},
        "passes": {"dev": F(0), "val": F(0)},
    }
    base.update(kw)
    return RunFacts(**base)  # type: ignore[arg-type]


def obs(run_id: str, g: F | None, scope: str = "common", task: str = "s") -> Observation:
    return Observation(task, f"m-{run_id}", "h", scope, g, B, run_id=run_id)


def test_budget_use_by_hand() -> None:
    runs = {
        "r1": facts(
            "r1",
            calls={"dev": 10, "val": 10},
            passes={"dev": F(4), "val": F(2)},
            first_bound="dev_case_passes",
        ),
        "r2": facts("r2", calls={"dev": 50, "val": 50}, passes={"dev": F(1), "val": F(1)}),
    }
    data = budget_use([obs("r1", F(1, 10)), obs("r2", F(2, 10), scope="native")], runs)
    one, two = data["runs"]
    assert one["call_usage"] == F(1, 10) and one["pass_usage"] == F(3, 4)
    assert one["max_split_pass_usage"] == 1 and one["exhausted_splits"] == ["dev"]
    assert two["call_usage"] == F(1, 2) and two["pass_usage"] == F(1, 4)
    assert two["exhausted_splits"] == [] and two["binds_first"] == "none"
    assert data["median_call_usage"] == F(3, 10) and data["median_pass_usage"] == F(1, 2)
    assert data["exhausted"] == 1
    assert data["exhausted_by_scope"] == {"common": "1/1", "native": "0/1"}
    assert data["binds_first"] == {"dev_case_passes": 1, "none": 1}


def test_tokens_beside_gain_by_hand() -> None:
    runs = {f"r{i}": facts(f"r{i}", target_tokens_search=10 * i) for i in (1, 2, 3)}
    gains = {"r1": F(3, 10), "r2": F(2, 10), "r3": F(1, 10)}
    data = tokens_vs_gain([obs(r, g) for r, g in gains.items()], runs)
    assert [r["target_tokens_search"] for r in data["runs"]] == [10, 20, 30]
    assert data["spearman_target_tokens_g"]["s"] == -1.0


def test_optimism_by_hand() -> None:
    runs = {
        "r1": facts("r1", val_best=F(7, 10), e_h_plus=F(6, 10), val_aggregates=3),
        "r2": facts("r2", val_best=F(5, 10), e_h_plus=F(55, 100), val_aggregates=1),
        "r3": facts("r3", val_best=None),
    }
    data = optimism([obs(r, F(0)) for r in runs], runs)
    assert [r["optimism"] for r in data["runs"]] == [F(1, 10), F(-5, 100)]
    assert [r["below_identity"] for r in data["runs"]] == [True, False]
    assert (data["below_identity"], data["of"]) == (1, 2)
    assert data["mean_optimism"] == F(25, 1000)
    assert data["left_out"] == [{"run": "r3", "why": "no val aggregate was disclosed"}]


def test_frontier_by_hand_with_a_tie_and_an_unmetered_run() -> None:
    points = {  # run: (optimizer tokens, g)
        "a": (100, F(2, 10)),
        "b": (200, F(2, 10)),  # a has the same gain for less: dominated
        "c": (300, F(5, 10)),
        "d": (300, F(4, 10)),  # c costs the same for more: dominated
        "e": (50, F(1, 10)),  # the cheapest
        "f": (100, F(2, 10)),  # the same point as a: neither dominates the other
        "z": (0, F(9, 10)),  # no metered optimizer calls: no cost to plot
    }
    runs = {r: facts(r, optimizer_tokens={"total": t}) for r, (t, _) in points.items()}
    data = frontier([obs(r, g) for r, (_, g) in points.items()], runs)
    rows = {p["run_id"]: p for p in data["tasks"]["s"]}
    assert {r for r, p in rows.items() if p["on_frontier"]} == {"a", "c", "e", "f"}
    assert rows["b"]["label"] == "same gain, costlier"
    assert rows["d"]["label"] == "same cost, lower gain"
    assert data["left_out"] == [{"run": "z", "why": "no optimizer tokens were metered"}]


def test_facts_of_a_run_read_from_its_records(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    writer = RunWriter(ledger, terms(seed_commit="a" * 40))
    honest_search(writer, "a" * 40, "b" * 40)
    honest_finish(writer, "b" * 40)
    got = facts_of(writer.run_id, ledger.records(writer.run_id))
    assert isinstance(got, RunFacts)
    # two dev requests and one val request were accepted; a second val request was refused
    assert got.calls == {"dev": 2, "val": 1}
    # the one val aggregate shown is the mean of its five trials' scores
    (val_request,) = [rid for rid, ts in writer.trials.items() if ts and ts[0].split == "val"]
    scores = [t.score for t in writer.trials[val_request]]
    assert got.val_best == sum(scores, F(0)) / len(scores) and got.val_aggregates == 1
    assert [c.commit for c in got.candidates] == ["a" * 40, "b" * 40]
    cut = facts_of(writer.run_id, list(ledger.records(writer.run_id))[:-2])
    assert cut == "not closed (still open, or its log is cut)"


def test_standard_error_of_the_round_means_by_hand() -> None:
    from holedger.analysis.stats import round_means_se

    # two cases, K = 3: rounds (1+0)/2, (1+1)/2, (0+0)/2 = 1/2, 1, 0; mean 1/2,
    # sample sd = sqrt(((0)^2 + (1/2)^2 + (1/2)^2) / 2) = 1/2; SE = (1/2) / sqrt(3)
    rounds, se = round_means_se([[F(1), F(1), F(0)], [F(0), F(1), F(0)]])
    assert rounds == [F(1, 2), F(1), F(0)]
    assert se == pytest.approx(0.5 / 3**0.5)
    assert round_means_se([[F(1)], [F(0)]]) == ([F(1, 2)], None)  # K = 1: no spread
    assert round_means_se([[F(1), F(0)], [F(1)]]) == ([], None)  # uneven attempts
