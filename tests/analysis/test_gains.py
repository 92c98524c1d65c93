"""Cross-run gains come from the signed RunScored events and the budget fold."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_protocol.runs import E_H0, RunWriter, honest_finish, honest_search, terms

from holedger.analysis.gains import RunGain, collect, gain_of, run_gain, summarize
from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.protocol import rules

SEED = "a" * 40
CAND = "b" * 40


def _scored_run(ledger: Ledger) -> RunWriter:
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    honest_finish(writer, CAND)
    return writer


def test_gain_equals_the_recorded_scores_and_the_budget_fold(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    writer = _scored_run(ledger)
    gain = run_gain(ledger, writer.run_id)
    assert gain is not None
    scored = [r.typed_payload() for r in ledger.records(writer.run_id) if r.type == "RunScored"]
    assert len(scored) == 1
    assert gain.e_h_plus == scored[0].e_h_plus  # type: ignore[attr-defined]
    assert gain.e_h0 == E_H0
    assert gain.g == rules.normalized_gain(gain.e_h_plus, E_H0)
    band = writer.terms.resolution_band
    assert gain.g is not None
    expected = "gain" if gain.g > band else "loss" if gain.g < -band else "within band"
    assert gain.versus_zero == expected
    budget = writer.terms.budget
    assert gain.budget_used["dev_calls"] == Fraction(writer.used.dev.calls, budget.dev.calls)
    assert (
        gain.budget_used["val_case_passes"] == writer.used.val.case_passes / budget.val.case_passes
    )


def test_unscored_and_open_runs_are_left_out_and_groups_summarise(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    first, second = _scored_run(ledger), _scored_run(ledger)
    open_run = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(open_run, SEED, CAND)
    gains = collect(ledger, verify=True)
    assert {g.run_id for g in gains} == {first.run_id, second.run_id}
    assert all(g.verified for g in gains)
    (group,) = summarize(gains)
    data = group.to_json()
    assert data["runs"] == 2
    assert data["mean_g"] == float(gains[0].g)  # type: ignore[arg-type]


def _initialised_home(tmp_path: Path) -> tuple[Path, CliRunner, Ledger]:
    """A home made by `holedger init`, a CLI runner, and the home's ledger."""
    home = tmp_path / "home"
    runner = CliRunner()
    assert runner.invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    return home, runner, Ledger.from_settings(Settings.resolve(home))


def test_analysis_gains_command_prints_json(tmp_path: Path) -> None:
    home, runner, ledger = _initialised_home(tmp_path)
    writer = _scored_run(ledger)
    result = runner.invoke(cli, ["--home", str(home), "analysis", "gains", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["run_id"] for r in data["runs"]] == [writer.run_id]
    assert data["groups"][0]["runs"] == 1


def test_runs_that_fail_replay_are_named_when_left_out(tmp_path: Path) -> None:
    home, runner, ledger = _initialised_home(tmp_path)
    honest = _scored_run(ledger)
    inflated = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(inflated, SEED, CAND)
    inflated.nominate(CAND)
    inflated.heldout(CAND)
    inflated.scored(CAND, e_h_plus=Fraction(1), g=Fraction(1))  # not what its trials say
    inflated.close()
    args = ["--home", str(home), "analysis", "gains"]
    data = json.loads(runner.invoke(cli, [*args, "--json"]).output)
    assert {r["run_id"] for r in data["runs"]} == {honest.run_id, inflated.run_id}
    assert data["replayed"] is False and data["excluded"] == []
    data = json.loads(runner.invoke(cli, [*args, "--verify", "--json"]).output)
    assert [r["run_id"] for r in data["runs"]] == [honest.run_id]
    assert data["replayed"] is True and data["excluded"] == [inflated.run_id]
    text = runner.invoke(cli, [*args, "--verify"]).output
    assert f"1 scored run left out: replay does not verify {inflated.run_id[:8]}" in text
    assert "not replayed: --verify" in runner.invoke(cli, args).output


def test_gains_from_bundles_alone_match_the_ledgers(tmp_path: Path) -> None:
    """A reviewer with bundles and no home computes the same gains, exact and pinned."""
    home, runner, ledger = _initialised_home(tmp_path)
    first, second = _scored_run(ledger), _scored_run(ledger)
    key = SigningKey.load(Settings.resolve(home).key_path).public.vkey()
    bundles = []
    for writer in (first, second):
        path = tmp_path / f"{writer.run_id}.hlb"
        args = ["--home", str(home), "export", writer.run_id, "-o", str(path)]
        assert runner.invoke(cli, args).exit_code == 0
        bundles += ["--bundle", str(path)]
    from_home = json.loads(
        runner.invoke(cli, ["--home", str(home), "analysis", "gains", "--json"]).output
    )
    nowhere = ["--home", str(tmp_path / "nowhere"), "analysis", "gains"]
    twice = [*bundles, *bundles]  # one run, however many bundles of it, counts once
    result = runner.invoke(cli, [*nowhere, *twice, "--verify", "--trusted-key", key, "--json"])
    assert result.exit_code == 0, result.output
    from_bundles = json.loads(result.output)
    assert not (tmp_path / "nowhere").exists()
    assert from_bundles["excluded"] == [] and from_bundles["replayed"] is True
    assert [r["verified"] for r in from_bundles["runs"]] == [True, True]
    strip = [{k: v for k, v in r.items() if k != "verified"} for r in from_bundles["runs"]]
    assert sorted(strip, key=lambda r: r["run_id"]) == sorted(
        ({k: v for k, v in r.items() if k != "verified"} for r in from_home["runs"]),
        key=lambda r: r["run_id"],
    )
    (group,) = from_bundles["groups"]
    g = Fraction(from_bundles["runs"][0]["g_exact"])  # both runs score alike
    assert from_bundles["runs"][0]["g"] == float(g)
    assert Fraction(group["mean_g_exact"]) == g and group["mean_g"] == float(g)
    assert group["task_digest"] == from_bundles["runs"][0]["task_digest"]
    # Pinned to a stranger's key, nothing verifies: both are left out, by name.
    stranger = SigningKey.generate("holedger-operator").public.vkey()
    args = [*nowhere, *bundles, "--verify", "--trusted-key", stranger, "--json"]
    refused = json.loads(runner.invoke(cli, args).output)
    assert refused["runs"] == [] and sorted(refused["excluded"]) == sorted(
        [first.run_id, second.run_id]
    )
    text = runner.invoke(cli, [*nowhere, *bundles, "--verify", "--trusted-key", stranger]).output
    assert "(see 'holedger verify BUNDLE')" in text
    unpinned = runner.invoke(cli, [*nowhere, *bundles, "--verify"]).output
    assert "under the keys each run declares: pin them with --trusted-key" in unpinned


def test_runs_of_two_versions_of_a_task_are_not_pooled(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    _scored_run(ledger)
    other = RunWriter(ledger, terms(seed_commit=SEED), task_digest="c" * 64)
    honest_search(other, SEED, CAND)
    honest_finish(other, CAND)
    groups = summarize(collect(ledger))
    assert len(groups) == 2 and "c" * 64 in {g.task_digest for g in groups}
    assert all(g.to_json()["runs"] == 1 for g in groups)


def test_a_log_cut_after_its_score_counts_no_gain(tmp_path: Path) -> None:
    """A bundle (or any record stream) whose RunScored is not followed by RunClosed is a
    cut log: analysis does not count its gain, verified or not."""
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    writer = _scored_run(ledger)
    records = list(ledger.records(writer.run_id))
    types = [r.type for r in records]
    assert "RunScored" in types and "RunClosed" in types
    assert gain_of(writer.run_id, records) is not None
    cut = records[: types.index("RunClosed")]
    assert "RunScored" in [r.type for r in cut]
    assert gain_of(writer.run_id, cut) is None
    ledger.close()


@pytest.mark.parametrize(
    ("g", "judged"),
    [
        (Fraction(1, 16), "gain"),  # 0.0625 > 0.05
        (Fraction(-1, 10), "loss"),  # resolved from 0 in the other direction
        (Fraction(1, 20), "within band"),  # |g| = b: not resolved (strict)
        (Fraction(-1, 20), "within band"),
        (Fraction(0), "within band"),
        (None, None),  # E(H0) = 1: g undefined
    ],
)
def test_a_gain_is_judged_by_the_two_sided_rule(g: Fraction | None, judged: str | None) -> None:
    gain = RunGain("r", "t", "d", "o", Fraction(1, 2), Fraction(1, 3), g, Fraction(1, 20), {})
    assert gain.versus_zero == judged
    (group,) = summarize([gain])
    data = group.to_json()
    counts = (data["resolved_gains"], data["resolved_losses"], data["within_band"])
    assert counts == {"gain": (1, 0, 0), "loss": (0, 1, 0), "within band": (0, 0, 1)}.get(
        judged or "", (0, 0, 0)
    )
