"""`holedger replay` prints the budget table and scores, and finds the run's repository."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

from click.testing import CliRunner

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.replay.report import score_text

from .runs import RunWriter, commit_files, honest_finish, honest_search, new_repo, terms

CAND = "b" * 40


def _home_with_run(tmp_path: Path) -> tuple[Path, str]:
    home = tmp_path / "home"
    settings = Settings.resolve(home)
    Ledger.init_home(settings)
    ledger = Ledger.from_settings(settings)
    try:
        writer = RunWriter(ledger, terms(seed_commit="a" * 40))
        honest_search(writer, "a" * 40, CAND)
        honest_finish(writer, CAND)
    finally:
        ledger.close()
    return home, writer.run_id


def test_text_report_shows_budget_table_and_scores(tmp_path: Path) -> None:
    home, run_id = _home_with_run(tmp_path)
    result = CliRunner().invoke(cli, ["--home", str(home), "replay", run_id[:8]])
    assert result.exit_code == 0, result.output
    assert "VERIFIED" in result.output
    assert "dev case_passes" in result.output and "50.0%" in result.output
    # a decimal to read, with the counts it is made of: E(H0) = 1/3 pinned with K = 2 on
    # the 4 test cases is a score total of 8/3 over 8 trials
    assert "scores: E(H+)" in result.output
    assert "E(H0) 0.333: 2.667 of 8 trials over 4 cases" in result.output
    # the task "rp-task" is not installed here: the audit says so instead of passing silently
    assert "leakage audit: skipped" in result.output
    json_result = CliRunner().invoke(cli, ["--home", str(home), "replay", run_id, "--json"])
    assert json.loads(json_result.output)["leakage"]["candidate_scan"]["repository_found"] is False


def test_json_report_carries_the_sections_and_the_home_repository(tmp_path: Path) -> None:
    home, run_id = _home_with_run(tmp_path)
    # a repository at the home's place for this run: the replay command hands it on
    repo = new_repo(Settings.resolve(home).run_repo(run_id))
    commit_files(repo, {"harness/__main__.py": "print('{}')\n"})
    result = CliRunner().invoke(cli, ["--home", str(home), "replay", run_id, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verified"] is True
    assert [row["component"] for row in report["budget_table"]][:4] == [
        "dev calls",
        "dev case_passes",
        "val calls",
        "val case_passes",
    ]
    # every quantity as a number and, beside it, the exact rational the log holds
    assert report["scores"]["e_h0"] == 1 / 3 and report["scores"]["e_h0_exact"] == "1/3"
    assert report["scores"]["trials"] == 8 and report["scores"]["cases"] == 4
    passes = {row["component"]: row for row in report["budget_table"]}["dev case_passes"]
    assert isinstance(passes["used"], float) and isinstance(passes["percent"], float)
    assert Fraction(passes["used_exact"]) == Fraction(passes["used"])
    scan = report["leakage"]["candidate_scan"]
    assert scan["status"] == "skipped" and scan["reason"]
    assert scan["repository_found"] is True


def test_scores_for_people_show_three_decimals() -> None:
    assert score_text("53/144") == "0.368"
    assert score_text(Fraction(-1, 8)) == "-0.125"
    assert score_text("1") == "1.000" and score_text(0) == "0.000"
    assert score_text(None) == "-"
    assert score_text("n/a") == "n/a"  # not a number: shown as it is
