"""Runs written by the real server (process backend), replayed with every protocol check.

The task is small and needs no model: each case asks for the product of two numbers; the
seed adds them instead (E(H0) = 0). A second candidate multiplies; a third does too but
also carries a lookup table of the test answers, which the leakage scan must report.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from holedger.config import Settings
from holedger.errors import BudgetExceededError
from holedger.ledger.records import parse_record
from holedger.ledger.store import Ledger
from holedger.replay.engine import replay_run
from holedger.replay.report import ReplayReport
from holedger.replay.taskdata import CaseData as ReplayCase
from holedger.replay.taskdata import TaskData
from holedger.schemas.events import BudgetVector, DisclosurePolicy, SplitBudget, TaskTerms
from holedger.server.candidates import seed_commit_id
from holedger.server.service import RunService
from holedger.server.taskview import CaseData, ServerTask

from .runs import checks

K = 2
SEED_MAIN = """import json, sys
case = json.loads(sys.stdin.read())
print(json.dumps({"answer": case["a"] + case["b"]}))
"""
GOOD_MAIN = SEED_MAIN.replace('case["a"] + case["b"]', 'case["a"] * case["b"]')
SPLITS = {"dev": range(0, 6), "val": range(6, 12), "test": range(12, 16)}


def _case(split: str, n: int) -> tuple[str, dict[str, Any], int]:
    a, b = 37 + 3 * n, 101 + 7 * n
    question = f"what is the product of {a} and {b}, as a whole number?"
    return f"mul-{split}-{n}", {"a": a, "b": b, "question": question}, a * b


CASES = {s: [_case(s, n) for n in ns] for s, ns in SPLITS.items()}


def _write(folder: Path, main: str, extra: dict[str, str] | None = None) -> Path:
    (folder / "harness").mkdir(parents=True)
    (folder / "harness" / "__init__.py").write_text("")
    (folder / "harness" / "__main__.py").write_text(main)
    for name, text in (extra or {}).items():
        (folder / name).write_text(text)
    return folder


def _task(root: Path) -> ServerTask:
    seed = _write(root / "seed", SEED_MAIN)
    sha = hashlib.sha256
    terms = TaskTerms(
        task_id="mul-task",
        models=[],
        split_sizes={s: len(c) for s, c in CASES.items()},
        split_digests={s: sha(repr(c).encode()).hexdigest() for s, c in CASES.items()},
        manifest_digest=sha(repr(CASES).encode()).hexdigest(),
        budget=BudgetVector(
            dev=SplitBudget(calls=2, case_passes=Fraction(4)),
            val=SplitBudget(calls=4, case_passes=Fraction(4)),
            target_tokens=0,
        ),
        disclosure=DisclosurePolicy(min_aggregate_cases=5),
        k=K,
        resolution_band=Fraction(1, 20),
        verifier_digest=sha(b"product").hexdigest(),
        seed_commit=seed_commit_id(seed),
        entrypoint=["python3", "-m", "harness"],
        immutable_paths=[],
        case_timeout_s=20,
        environment_digest=sha(b"env").hexdigest(),
    )
    expected = {cid: answer for cases in CASES.values() for cid, _, answer in cases}

    def cases(split: str) -> list[CaseData]:
        return [CaseData(cid, data) for cid, data, _ in CASES[split]]

    def verify(case_id: str, answer: Any) -> Fraction:
        ok = isinstance(answer, dict) and answer.get("answer") == expected[case_id]
        return Fraction(1 if ok else 0)

    return ServerTask(
        "mul", terms, sha(terms.model_dump_json().encode()).hexdigest(), seed, cases, verify
    )


def _task_data(task: ServerTask) -> TaskData:
    splits = {
        s: [ReplayCase(cid, data, {"value": ans}) for cid, data, ans in c] for s, c in CASES.items()
    }
    return TaskData(task.terms.task_id, task.digest, splits, task.verify)


@pytest.fixture(scope="module")
def server_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Settings, ServerTask, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("server-run")
    settings = Settings.resolve(root / "home")
    Ledger.init_home(settings)
    task = _task(root / "task")
    service = RunService(
        settings,
        Ledger.from_settings(settings),
        gateway=None,
        task_loader=lambda ref: task,
        default_backend="process",
        workers=2,
    )
    try:
        opened = service.open_run("mul", optimizer="replay-test")
        good = service.commit_candidate(opened.run_id, _write(root / "good", GOOD_MAIN))
        table = "".join(f"{cid!r}: {ans},\n" for cid, _, ans in CASES["test"])
        cheat = service.commit_candidate(
            opened.run_id,
            _write(
                root / "cheat", GOOD_MAIN, {"harness/table.py": "ANSWERS = {\n" + table + "}\n"}
            ),
        )
        dev_ids = [cid for cid, _, _ in CASES["dev"]]
        service.evaluate(opened.run_id, "seed", "dev", dev_ids[:3], 1)
        service.evaluate(opened.run_id, good.candidate, "dev", dev_ids, 2)
        with pytest.raises(BudgetExceededError):
            service.evaluate(opened.run_id, good.candidate, "dev", dev_ids[:1], 1)
        service.evaluate(opened.run_id, cheat.candidate, "val", None, 1)
        scored = service.nominate(opened.run_id, good.candidate)
    finally:
        service.close()
        service.ledger.close()
    info = {
        "run_id": opened.run_id,
        "baseline_run_id": opened.seed_baseline.baseline_run_id if opened.seed_baseline else None,
        "good": good.candidate,
        "cheat": cheat.candidate,
        "seed": opened.seed_commit,
        "scored": scored,
    }
    yield settings, task, info


def _replay(settings: Settings, task: ServerTask, run_id: str) -> ReplayReport:
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        extra = {"task_data": _task_data(task), "run_repo": settings.run_repo(run_id)}
        return replay_run(ledger, run_id, extra=extra)
    finally:
        ledger.close()


def test_server_run_verifies_and_the_scan_reports_the_unnominated_cheat(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    settings, task, info = server_run
    report = _replay(settings, task, info["run_id"])
    ok = checks(report)
    for name in (
        "budget",
        "disclosure",
        "scores",
        "leakage",
        "candidates_committed",
        "test_split_sealed",
        "nomination",
        "trials_match_requests",
        "candidate_scan",
    ):
        assert ok[name], (name, report.failures)
    # the cheat was not nominated: the score stands, the attempt is reported as a warning
    assert ok["candidate_scan"]
    warned = {c.name for c in report.checks if c.level == "warning" and not c.ok}
    assert "candidate_scan_unnominated" in warned
    baseline = info["baseline_run_id"]
    assert baseline and report.sections["scores"]["baseline_run_id"] == baseline
    [detail] = [c.detail for c in report.checks if c.name == "scores"]
    assert f"as pinned from baseline run {baseline} (verify that run too)" in detail
    assert report.failures == []
    assert report.verified
    warning = {c.name: c for c in report.checks}["candidate_scan_unnominated"]
    assert warning.level == "warning" and "harness/table.py: lookup table" in warning.detail
    findings = report.sections["leakage"]["candidate_scan"]["findings"]
    assert [(f["candidate"], f["file"], f["kind"]) for f in findings] == [
        (info["cheat"], "harness/table.py", "lookup table")
    ]
    assert [line["line"] for line in findings[0]["lines"]] == [2, 3, 4, 5]


def test_server_run_budget_table_and_scores_are_re_derived(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    settings, task, info = server_run
    report = _replay(settings, task, info["run_id"])
    table = {row["component"]: row for row in report.sections["budget_table"]}
    # independent count: dev 3x1 + 6x2 case-passes over 6 cases, 2 calls; one refused
    assert table["dev calls"] == {
        "component": "dev calls",
        "used": "2",
        "limit": "2",
        "percent": "100.0%",
    }
    assert table["dev case_passes"]["used"] == "2.5"
    assert table["val calls"]["used"] == "1" and table["val case_passes"]["used"] == "1"
    assert "1 rejected" in {c.name: c.detail for c in report.checks}["budget"]
    scores = report.sections["scores"]
    assert (scores["e_h_plus"], scores["e_h0"], scores["g"]) == ("1", "0", "1")
    assert scores["exceeds_band"] is True
    assert scores["e_h0_source"] == "pinned seed baseline"


def test_the_baseline_run_verifies_and_its_seed_is_not_reported(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    settings, task, info = server_run
    assert info["baseline_run_id"] is not None
    report = _replay(settings, task, info["baseline_run_id"])
    assert {f.check for f in report.failures} == set(), report.failures
    scan = report.sections["leakage"]["candidate_scan"]
    assert scan["status"] == "done" and scan["candidates"] == 1 and scan["findings"] == []
    assert report.sections["scores"]["e_h_plus"] == "0"


def test_a_key_holder_who_changes_a_held_out_score_is_caught_by_rescoring(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    """The operator's key re-signs the run with one held-out trial scored 0 instead of 1
    (the nominee answers every test case right) and RunScored recomputed to match: every
    signature, the chain, the checkpoints and the score arithmetic hold. Only re-scoring
    the trial's recorded answer with the task's verifier shows the score does not follow
    from it."""
    from ledger.attacker import Row, resign_run

    from holedger.ledger.keys import SigningKey
    from holedger.replay.engine import LedgerBlobs, verify_records
    from holedger.schemas.canonical import rational_to_str
    from holedger.server import rules

    settings, task, info = server_run
    honest = _replay(settings, task, info["run_id"])
    [detail] = [c.detail for c in honest.checks if c.name == "rescored"]
    assert "re-scored by the task's verifier: every recorded score agrees" in detail
    assert honest.sections["rescored"]["rescored"] > 0
    key = SigningKey.load(settings.key_path)
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        rows = [
            Row(0, seq + 1, "", raw)
            for seq, raw in enumerate(raw for _, raw in ledger.raw_records(info["run_id"]))
        ]
        records = [parse_record(row.state) for row in rows]
        target = next(
            r.payload
            for r in records
            if r.type == "TrialCompleted"
            and r.payload["split"] == "test"
            and r.payload["score"] == "1"
        )
        scored = next(r.payload for r in records if r.type == "RunScored")
        per_case = {c["case_id"]: [Fraction(s) for s in c["scores"]] for c in scored["per_case"]}
        per_case[target["case_id"]][target["attempt"]] = Fraction(0)
        e_plus = rules.expected_score(per_case)
        gain = rules.normalized_gain(e_plus, Fraction(scored["e_h0"]))

        def raise_it(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
            if event_type == "TrialCompleted" and payload["trial_id"] == target["trial_id"]:
                return {**payload, "score": "0"}
            if event_type == "RunScored":
                return {
                    **payload,
                    "per_case": [
                        {"case_id": c, "scores": [rational_to_str(s) for s in v]}
                        for c, v in per_case.items()
                    ],
                    "e_h_plus": rational_to_str(e_plus),
                    "g": None if gain is None else rational_to_str(gain),
                }
            return payload

        forged = resign_run(rows, key, edit=raise_it)
        extra = {"task_data": _task_data(task), "run_repo": settings.run_repo(info["run_id"])}
        report = verify_records(
            info["run_id"], forged, LedgerBlobs(ledger), trusted_keys=[key.public], extra=extra
        )
    finally:
        ledger.close()
    assert report.failed_checks() == ["rescored"], report.failures
    [failure] = report.failures
    assert target["trial_id"] in failure.reason
    assert "recorded score 0, but the task's verifier scores its answer 1" in failure.reason
