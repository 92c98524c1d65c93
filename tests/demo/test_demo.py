"""`holedger demo` end to end: a real run in a real sandbox, verified, with a real gain."""

from __future__ import annotations

import json
import re
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.sandboxes import available_backends

from .conftest import TourState

# The first test to use the `tour` fixture runs the whole demo (minutes on a busy machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _holedger(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["holedger", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_demo_verifies_and_gains_above_the_band(tour: TourState) -> None:
    demo = tour.demo
    assert demo["verified"] is True, tour.stderr[-3000:]
    g = Fraction(demo["g_exact"])
    band = Fraction(demo["resolution_band_exact"])
    assert g > band, f"g {demo['g']} is not above the band {demo['resolution_band']}"
    assert Fraction(demo["test_score_exact"]) > Fraction(demo["seed_score_exact"])
    assert demo["band_outcome"] == "resolved gain" and demo["resolved_gain"] is True
    # numbers are JSON numbers, each beside its exact rational; counts are integers
    for key in ("g", "resolution_band", "test_score", "seed_score"):
        assert demo[key] == float(Fraction(demo[f"{key}_exact"])), key
    assert demo["trials"] == demo["cases"] * demo["k"] > 0
    # E(H+) and the pinned E(H0) with the standard error of their K round means (A3)
    assert demo["test_score_se"] is not None and demo["seed_score_se"] is not None
    assert float(demo["test_score_se"]) >= 0
    assert set(demo) >= {
        "run_id",
        "verified",
        "test_score",
        "seed_score",
        "g",
        "resolution_band",
        "backend",
        "report",
        "budget",
        "seconds",
    }


def test_demo_uses_the_strongest_backend_available(tour: TourState) -> None:
    usable = [name for name, ok, _ in available_backends() if ok and name != "process"]
    if usable:
        assert tour.demo["backend"] == usable[0]
        assert tour.demo["isolation"] == "isolated"
    else:
        assert tour.demo["backend"] == "process"
        assert "NO isolation" in tour.stderr


def test_budget_stays_within_every_limit(tour: TourState) -> None:
    budget: dict[str, dict[str, Any]] = tour.demo["budget"]
    components = set(budget)
    assert {"dev calls", "dev case_passes", "val calls", "val case_passes"} <= components
    for name, row in budget.items():
        used, limit = Fraction(row["used_exact"]), Fraction(row["limit_exact"])
        assert used <= limit, name
        assert row["used"] == float(used) and isinstance(row["percent"], float), name
    assert budget["dev calls"]["used"] > 0
    assert budget["val calls"]["used"] > 0


def test_replay_command_agrees_from_a_fresh_process(tour: TourState) -> None:
    proc = _holedger(tour.home, "replay", tour.demo["run_id"], "--json")
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.loads(proc.stdout)
    assert report["verified"] is True
    checks = {c["name"]: c for c in report["checks"]}
    for name in ("signatures", "chain", "checkpoints", "closed", "budget", "scores", "leakage"):
        assert checks[name]["ok"], checks[name]
    assert report["scores"]["g"] == tour.demo["g"]
    # No key given: the verdict holds for the keys the run declares, and says so.
    assert "keys_pinned" in report["warnings"]
    vkey = _holedger(tour.home, "keys", "show").stdout.strip()
    pinned = _holedger(tour.home, "replay", tour.demo["run_id"], "--trusted-key", vkey, "--json")
    assert pinned.returncode == 0 and "keys_pinned" not in json.loads(pinned.stdout)["warnings"]


def _task_test_items() -> tuple[set[str], set[str], set[str], set[str]]:
    """(test case ids, test inputs, test-only expected answers, all search-split answers)."""
    from holedger.tasks import load_task

    loaded = load_task("officeqa-lite")
    ids, inputs, answers, other = set(), set(), set(), set()
    for split in ("dev", "val", "test"):
        for case in loaded.cases(split):
            expected = json.dumps(case.expected, sort_keys=True)
            values = {str(v) for v in re.findall(r"-?\d+(?:\.\d+)?", expected)}
            if split == "test":
                ids.add(case.id)
                for leaf in _strings(case.input):
                    if len(leaf) >= 24:
                        inputs.add(leaf)
                answers |= values
            else:
                other |= values
    return ids, inputs, answers - other, other


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_optimizer_log_holds_no_test_split_information(tour: TourState) -> None:
    log_path = Path(tour.demo["optimizer_log"])
    entries = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    # It saw a lot: run info, every commit, every projection, its nomination.
    paths = [e["path"] for e in entries]
    assert "" in paths and "/nomination" in paths
    assert sum(p == "/evaluations" for p in paths) >= 5
    text = log_path.read_text()
    ids, inputs, test_only_answers, _ = _task_test_items()
    assert ids and inputs
    assert not [i for i in ids if re.search(rf"\b{re.escape(i)}\b", text)]
    assert not [q for q in inputs if q in text]
    # Numbers from the shared corpus can coincide; the audit's rule is "no three distinct
    # test-only answers", and the log must hold none of them as a whole token either.
    hits = {
        a
        for a in test_only_answers
        if len(a.lstrip("-")) >= 2 and re.search(rf"(?<![\w.]){re.escape(a)}(?![\w.])", text)
    }
    assert len(hits) < 3, sorted(hits)


def test_leakage_audit_agrees_with_the_log(tour: TourState) -> None:
    cfg = Settings.resolve(tour.home)
    from holedger.demo.report import replay_in_home

    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        report = replay_in_home(cfg, ledger, tour.demo["run_id"])
    finally:
        ledger.close()
    leakage = report.sections["leakage"]
    assert leakage["audit"]["status"] == "done", leakage["audit"]
    assert leakage["audit"]["findings"] == []
    assert leakage["candidate_scan"]["status"] == "done", leakage["candidate_scan"]
    assert leakage["candidate_scan"]["findings"] == []
    # every projection the optimizer logged is one the audit covered, by digest
    shown = {s["digest"] for s in leakage["shown"]}
    log_path = Path(tour.demo["optimizer_log"])
    logged = {
        e["body"]["projection_digest"]
        for e in map(json.loads, log_path.read_text().splitlines())
        if e["path"] == "/evaluations" and e["status"] == 200
    }
    assert logged and logged <= shown


def test_demo_report_is_well_formed_and_self_contained(tour: TourState) -> None:
    from report.html_checks import page_problems

    page = Path(tour.demo["report"]).read_text()
    assert page_problems(page) == []
    assert "VERIFIED" in page
    assert tour.demo["run_id"] in page


def test_a_second_demo_reuses_the_pinned_baseline(tour: TourState) -> None:
    cfg = Settings.resolve(tour.home)
    baselines = list((cfg.home / "baselines").glob("*.json"))
    assert len(baselines) == 1
    record = json.loads(baselines[0].read_text())
    assert Fraction(record["e_h0"]) == Fraction(tour.demo["seed_score_exact"])
    ledger = Ledger.open(cfg.ledger_url, None, create_tables=False)
    try:
        labels = [r.optimizer for r in ledger.runs()]
    finally:
        ledger.close()
    assert labels.count("seed-baseline") == 1


@pytest.mark.parametrize("bad", ["nope"])
def test_unknown_backend_is_one_line_with_a_hint(tmp_path: Path, bad: str) -> None:
    proc = _holedger(tmp_path / "home", "demo", "--backend", bad)
    assert proc.returncode == 3 or proc.returncode == 2
    assert proc.stderr.startswith("holedger: error:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_summary_never_breaks_a_path_or_command_across_lines(tmp_path: Path) -> None:
    """Printed to a narrow or non-terminal output, the report path, the optimizer log and
    the replay command stay whole on their lines, so they copy as they are."""
    import io

    from rich.console import Console

    from holedger.demo.run import DemoSummary, print_summary
    from holedger.replay.report import CheckResult, ReplayReport

    deep = tmp_path / ("a-directory-with-a-long-name" * 3) / ".holedger" / "reports"
    run_id = "7707f7cb-d97d-42e0-9867-0be37884295c"
    summary = DemoSummary(
        run_id=run_id,
        verified=True,
        test_score=Fraction(13, 16),
        seed_score=Fraction(3, 8),
        g=Fraction(7, 10),
        resolution_band=Fraction(1, 20),
        backend="bwrap",
        isolation="isolated",
        report=deep / f"{run_id}.html",
        budget={"dev calls": {"used": 10, "limit": 100, "percent": "10.0%"}},
        seconds=206.0,
        replay_command=f"holedger --home {deep.parent} replay {run_id}",
        optimizer_log=deep / f"{run_id}.optimizer.jsonl",
        optimizer_exit=0,
    )
    report = ReplayReport(
        run_id=run_id,
        verified=True,
        events=585,
        checks=[CheckResult(name="signatures", ok=True, detail="")],
        failures=[],
    )
    buffer = io.StringIO()
    print_summary(Console(file=buffer, width=60, highlight=False), summary, report)
    lines = buffer.getvalue().splitlines()
    for whole in (str(summary.report), str(summary.optimizer_log), summary.replay_command):
        assert any(line.endswith(whole) for line in lines), whole
