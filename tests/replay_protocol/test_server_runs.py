"""Runs written by the real server (process backend), replayed with every protocol check.

The task is small and needs no model: each case asks for the product of two numbers; the
seed adds them instead (E(H0) = 0). A second candidate multiplies; a third does too but
also carries a lookup table of the test answers, which the leakage scan must report.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from holedger.config import Settings
from holedger.errors import BudgetExceededError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.store import Ledger
from holedger.replay.inputs import CaseData as ReplayCase
from holedger.replay.inputs import CheckInputs, TaskData
from holedger.replay.report import ReplayReport
from holedger.replay.runs import replay_run
from holedger.schemas.events import BudgetVector, DisclosurePolicy, SplitBudget, TaskTerms
from holedger.server.candidates import seed_commit_id
from holedger.server.service import RunService, ServerConfig
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
        ServerConfig(
            gateway=None, task_loader=lambda ref: task, default_backend="process", workers=2
        ),
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
        inputs = CheckInputs(task_data=_task_data(task), run_repo=settings.run_repo(run_id))
        return replay_run(ledger, run_id, inputs=inputs)
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
    assert f"as pinned from baseline run {baseline} (see the baseline check)" in detail
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
    assert scores["band_outcome"] == "resolved gain"  # g = 1 > 1/20
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
    from holedger.protocol import rules
    from holedger.replay.runs import LedgerBlobs, verify_records
    from holedger.schemas.canonical import rational_to_str

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
                    # its error bar too: the forger recomputes everything RunScored holds
                    "e_h_plus_error": error.model_dump(mode="json") if error else None,
                }
            return payload

        error = rules.round_error(per_case.values())
        forged = resign_run(rows, key, edit=raise_it)
        inputs = CheckInputs(task_data=_task_data(task), run_repo=settings.run_repo(info["run_id"]))
        report = verify_records(
            info["run_id"], forged, LedgerBlobs(ledger), trusted_keys=[key.public], inputs=inputs
        )
    finally:
        ledger.close()
    assert report.failed_checks() == ["rescored"], report.failures
    [failure] = report.failures
    assert target["trial_id"] in failure.reason
    assert "recorded score 0, but the task's verifier scores its answer 1" in failure.reason


# --------------------------------------------------------------------------- the baseline


def _records(ledger: Ledger, run_id: str) -> list[Any]:
    from ledger.attacker import Row

    return [
        Row(0, seq + 1, "", raw)
        for seq, raw in enumerate(raw for _, raw in ledger.raw_records(run_id))
    ]


class _Given:
    """A baseline source holding one replayed run, as ``verify --baseline`` gives one."""

    given = True

    def __init__(self, found: Any) -> None:
        self.found = found

    def baseline(self, run_id: str) -> Any:
        return self.found


def _replayed(ledger: Ledger, run_id: str, records: list[bytes], inputs: CheckInputs) -> Any:
    """``records`` replayed as a baseline run is (every check, facts captured)."""
    from holedger.replay.checks import CHECKS
    from holedger.replay.checks.baseline import baseline_run, capturing
    from holedger.replay.runs import LedgerBlobs, verify_records

    checks, facts = capturing(CHECKS)
    report = verify_records(
        run_id, records, LedgerBlobs(ledger), checks=checks, inputs=inputs.for_baseline()
    )
    return baseline_run(run_id, report, facts)


def test_replay_checks_the_pinned_e_h0_against_the_baseline_run_itself(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    settings, task, info = server_run
    report = _replay(settings, task, info["run_id"])
    [check] = [c for c in report.checks if c.name == "baseline"]
    assert check.ok and check.level == "error", check
    assert f"E(H+) of baseline run {info['baseline_run_id']}, verified (" in check.detail
    section = report.sections["baseline"]
    assert section["run_id"] == info["baseline_run_id"] and section["matches"] is True
    assert section["verified"] is True and section["events"] > 10
    # a baseline run pins no baseline: it has no such check
    own = _replay(settings, task, info["baseline_run_id"])
    assert "baseline" not in {c.name for c in own.checks} and own.verified


@pytest.mark.parametrize("where", ["opened_only", "opened_and_scored"])
def test_a_key_holder_who_pins_another_e_h0_is_caught_by_the_baseline_check(
    server_run: tuple[Settings, ServerTask, dict[str, Any]], where: str
) -> None:
    """The operator's key re-signs the run with a different pinned E(H0): alone, the scores
    check already fails (RunScored no longer repeats the pin); with RunScored's E(H0) and g
    recomputed to match, every other check holds and only the baseline run, replayed, shows
    the pin is not what it scored."""
    from ledger.attacker import resign_run

    from holedger.ledger.keys import SigningKey
    from holedger.protocol import rules
    from holedger.replay.runs import LedgerBaselines, LedgerBlobs, verify_records
    from holedger.schemas.canonical import rational_to_str

    settings, task, info = server_run
    key = SigningKey.load(settings.key_path)
    inputs = CheckInputs(task_data=_task_data(task))
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        rows = _records(ledger, info["run_id"])
        scored = next(
            parse_record(r.state).payload for r in rows if parse_record(r.state).type == "RunScored"
        )
        assert Fraction(scored["e_h0"]) == 0  # the seed answers nothing right
        forged_e0 = Fraction(1, 4)
        gain = rules.normalized_gain(Fraction(scored["e_h_plus"]), forged_e0)

        def pin(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
            if event_type == "RunOpened":
                base = {**payload["seed_baseline"], "e_h0": rational_to_str(forged_e0)}
                return {**payload, "seed_baseline": base}
            if event_type == "RunScored" and where == "opened_and_scored":
                return {
                    **payload,
                    "e_h0": rational_to_str(forged_e0),
                    "g": None if gain is None else rational_to_str(gain),
                }
            return payload

        forged = resign_run(rows, key, edit=pin)
        report = verify_records(
            info["run_id"],
            forged,
            LedgerBlobs(ledger),
            trusted_keys=[key.public],
            inputs=replace(inputs, baselines=LedgerBaselines(ledger, [key.public], inputs)),
        )
    finally:
        ledger.close()
    expected = ["scores", "baseline"] if where == "opened_only" else ["baseline"]
    assert report.failed_checks() == expected, report.failures
    [failure] = [f for f in report.failures if f.check == "baseline"]
    assert failure.seq == 0 and failure.type == "RunOpened"
    assert failure.reason == (
        f"baseline run {info['baseline_run_id']} scored E(H+) 0, the pinned E(H0) is 0.25"
    )


def test_a_key_holder_who_pins_a_smaller_e_h0_error_bar_is_caught_by_the_baseline_check(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    """The pin's E(H0) error bar (and RunScored's copy of it) re-signed smaller: the scores
    check holds (RunScored repeats the pin), the baseline run, replayed, shows it is not the
    standard error of its round means."""
    from ledger.attacker import resign_run

    from holedger.ledger.keys import SigningKey
    from holedger.replay.runs import LedgerBaselines, LedgerBlobs, verify_records

    settings, task, info = server_run
    key = SigningKey.load(settings.key_path)
    inputs = CheckInputs(task_data=_task_data(task))
    forged_error = {"round_means": ["0", "0"], "se": "0.000000001"}
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        rows = _records(ledger, info["run_id"])

        def shrink(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
            if event_type == "RunOpened":
                assert payload["seed_baseline"]["e_h0_error"]["se"] == "0.000000000"
                base = {**payload["seed_baseline"], "e_h0_error": forged_error}
                return {**payload, "seed_baseline": base}
            if event_type == "RunScored":
                return {**payload, "e_h0_error": forged_error}
            return payload

        report = verify_records(
            info["run_id"],
            resign_run(rows, key, edit=shrink),
            LedgerBlobs(ledger),
            trusted_keys=[key.public],
            inputs=replace(inputs, baselines=LedgerBaselines(ledger, [key.public], inputs)),
        )
    finally:
        ledger.close()
    assert report.failed_checks() == ["baseline"], report.failures
    [failure] = report.failures
    assert failure.reason == (
        "the pinned E(H0) error bar (se 0.000000001) is not that of baseline run "
        f"{info['baseline_run_id']}'s round means (se 0.000000000)"
    )


ABSENT = "00000000-0000-4000-8000-000000000000"


def test_pins_only_a_rewritten_log_can_hold_fail_and_an_unnamed_one_warns(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    """The key holder re-signs the run with its pin changed. Pinning the run itself (a
    cycle a naive check would follow for ever) fails: it is not a seed-baseline run and did
    not score its seed. A run id the ledger does not hold, or no run id at all, fails (the
    server pins only runs of its own ledger), as does a scored run with its pin removed
    (its E(H0) then comes from nowhere). A pin naming no run is a warning."""
    from ledger.attacker import resign_run

    from holedger.ledger.keys import SigningKey
    from holedger.replay.runs import LedgerBaselines, LedgerBlobs, verify_records

    settings, task, info = server_run
    key = SigningKey.load(settings.key_path)
    inputs = CheckInputs(task_data=_task_data(task))
    reports = {}
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        rows = _records(ledger, info["run_id"])
        for name, target in (
            ("itself", info["run_id"]),
            ("absent", ABSENT),
            ("malformed", "x"),
            ("unnamed", None),
            ("removed", "-"),
        ):

            def pin(event_type: str, payload: dict[str, Any], to: Any = target) -> dict[str, Any]:
                if event_type == "RunOpened" and to == "-":
                    return {k: v for k, v in payload.items() if k != "seed_baseline"}
                if event_type == "RunScored" and to == "-":  # nor its pinned error bar
                    return {k: v for k, v in payload.items() if k != "e_h0_error"}
                if event_type == "RunOpened":
                    base = {**payload["seed_baseline"], "baseline_run_id": to}
                    return {**payload, "seed_baseline": base}
                return payload

            forged = resign_run(rows, key, edit=pin)
            if name == "itself":  # the ledger's copy of the run is the forged one here
                source: Any = _Given(_replayed(ledger, target, forged, inputs))
            else:
                source = LedgerBaselines(ledger, [key.public], inputs)
            reports[name] = verify_records(
                info["run_id"],
                forged,
                LedgerBlobs(ledger),
                trusted_keys=[key.public],
                inputs=replace(inputs, baselines=source),
            )
    finally:
        ledger.close()
    itself = reports["itself"]
    assert itself.failed_checks() == ["baseline"], itself.failures
    reasons = [f.reason for f in itself.failures]
    name = f"baseline run {info['run_id']}"
    assert (
        f"{name} is not a seed-baseline run (optimizer 'replay-test', pins a baseline of its own)"
        in reasons
    )
    assert (
        f"{name} scored candidate {info['good'][:12]}, not its seed {info['seed'][:12]}" in reasons
    )
    expected = {
        "absent": f"the pinned baseline run {ABSENT} is not in this ledger",
        "malformed": "the pinned baseline run id is unusable: not a run id: 'x'",
        "removed": "a scored run of optimizer 'replay-test' pins no seed baseline: its E(H0) "
        "comes from nowhere the log can show",
    }
    for case, reason in expected.items():
        report = reports[case]
        assert report.failed_checks() == ["baseline"], (case, report.failures)
        assert [f.reason for f in report.failures] == [reason], case
    unnamed = reports["unnamed"]
    assert unnamed.verified and "baseline" in unnamed.to_json()["warnings"]
    [check] = [c for c in unnamed.checks if c.name == "baseline"]
    assert check.level == "warning" and check.detail == (
        "E(H0) is pinned without naming a baseline run to check"
    )
    assert unnamed.sections["baseline"]["checked"] is False


@pytest.mark.parametrize(
    "forgery",
    ["other_key", "per_case_order", "optimizer_label", "task_digest", "seed", "truncated"],
)
def test_a_substituted_baseline_run_is_caught(
    server_run: tuple[Settings, ServerTask, dict[str, Any]], forgery: str
) -> None:
    """The baseline run handed over is re-signed with one thing changed; it still verifies
    on its own (keys unpinned), and the comparison names what differs from the pin."""
    from ledger.attacker import resign_run

    from holedger.ledger.keys import SigningKey

    settings, task, info = server_run
    operator = SigningKey.load(settings.key_path)
    key = SigningKey.generate("someone-else") if forgery == "other_key" else operator

    def change(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event_type == "RunScored" and forgery == "per_case_order":
            return {**payload, "per_case": list(reversed(payload["per_case"]))}
        if event_type == "RunOpened" and forgery == "optimizer_label":
            return {**payload, "optimizer": "my-optimizer"}
        if event_type == "RunOpened" and forgery == "task_digest":
            return {**payload, "task_digest": "e" * 64}
        if event_type != "RunOpened" and forgery == "seed":  # another commit scored
            return json.loads(json.dumps(payload).replace(info["seed"], "ab" * 20))
        return payload

    inputs = CheckInputs(task_data=_task_data(task))
    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        baseline = info["baseline_run_id"]
        forged = resign_run(_records(ledger, baseline), key, edit=change)
        if forgery == "truncated":  # cut before its RunScored
            [scored_at] = [i for i, r in enumerate(forged) if b'"type":"RunScored"' in r]
            forged = forged[:scored_at]
        found = _replayed(ledger, baseline, forged, inputs)
        assert found.report.verified == (forgery != "truncated"), found.report.failures
        given = replace(inputs, baselines=_Given(found))
        report = replay_run(ledger, info["run_id"], inputs=given)
    finally:
        ledger.close()
    assert report.failed_checks() == ["baseline"], report.failures
    [failure] = report.failures
    expected = {
        "other_key": f"baseline run {baseline} is signed by server key "
        f"someone-else+{key.key_id_hex}, not this run's",
        "per_case_order": f"baseline run {baseline}'s per-case scores do not have the pinned "
        "digest",
        "optimizer_label": f"baseline run {baseline} is not a seed-baseline run (optimizer "
        "'my-optimizer')",
        "task_digest": f"baseline run {baseline} is of task digest {'e' * 64}, not this run's",
        "seed": f"baseline run {baseline} scored candidate {'ab' * 6}, not its seed "
        f"{info['seed'][:12]} (committed first: another)",
        "truncated": f"baseline run {baseline} does not verify (failed checks: closed, scores)",
    }[forgery]
    assert failure.reason == expected


def test_export_and_verify_carry_the_baseline_run(
    server_run: tuple[Settings, ServerTask, dict[str, Any]], tmp_path: Path
) -> None:
    """`export --baseline-output` writes the pinned baseline run beside the run, and
    `verify --baseline` checks it; without it the check warns, with another run's bundle
    it fails, and an unreadable file is bad usage naming it."""
    import json

    from click.testing import CliRunner

    from holedger.cli import cli

    settings, _, info = server_run
    runner = CliRunner()
    home = ["--home", str(settings.home)]
    run_file, base_file = tmp_path / "run.hlb", tmp_path / "base.hlb"
    out = runner.invoke(
        cli,
        [
            *home,
            "export",
            info["run_id"],
            "-o",
            str(run_file),
            "--baseline-output",
            str(base_file),
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["run_id"] == info["run_id"]
    assert summary["baseline"]["run_id"] == info["baseline_run_id"]
    assert summary["baseline"]["path"] == str(base_file)
    key = _operator_vkey(settings)

    def verify(*args: str) -> tuple[int, dict[str, Any]]:
        result = runner.invoke(
            cli, ["verify", str(run_file), "--trusted-key", key, "--json", *args]
        )
        return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}

    code, report = verify("--baseline", str(base_file))
    assert code == 0 and report["verified"], report.get("failures")
    [check] = [c for c in report["checks"] if c["name"] == "baseline"]
    assert check["ok"] and check["level"] == "error"
    assert report["baseline"]["run_id"] == info["baseline_run_id"]

    code, report = verify()
    assert code == 0 and "baseline" in report["warnings"]

    code, report = verify("--baseline", str(run_file))
    assert code == 1 and report["verified"] is False
    assert [f["reason"] for f in report["failures"] if f["check"] == "baseline"] == [
        f"the baseline given is run {info['run_id']}, not the pinned {info['baseline_run_id']}"
    ]

    junk = tmp_path / "junk.hlb"
    junk.write_bytes(b"not a bundle")
    result = runner.invoke(cli, ["verify", str(run_file), "--baseline", str(junk)])
    assert result.exit_code == 2
    assert f"baseline bundle {junk}:" in result.output

    # a baseline run pins none: asking for its baseline is refused before anything is written
    lone = tmp_path / "lone.hlb"
    result = runner.invoke(
        cli,
        [
            *home,
            "export",
            info["baseline_run_id"],
            "-o",
            str(lone),
            "--baseline-output",
            str(tmp_path / "b2.hlb"),
        ],
    )
    assert result.exit_code == 2 and "pins no seed-baseline run" in result.output
    assert not lone.exists()
    # the baseline's own bundle given with --baseline to verify itself: said, not used
    result = runner.invoke(
        cli,
        ["verify", str(base_file), "--trusted-key", key, "--baseline", str(base_file), "--json"],
    )
    own = json.loads(result.stdout)
    assert result.exit_code == 0 and "baseline" in own["warnings"]  # (isolation: "process")
    [check] = [c for c in own["checks"] if c["name"] == "baseline"]
    assert check["detail"] == "the run pins no seed baseline: --baseline not used"


def test_analysis_of_bundles_counts_a_run_only_with_its_baseline_verified(
    server_run: tuple[Settings, ServerTask, dict[str, Any]], tmp_path: Path
) -> None:
    """`analysis gains --verify --bundle ...` verifies each run with its seed-baseline
    run's bundle, which must be among those given: a run re-signed by the operator key
    with another pinned E(H0) is left out; without the baseline's bundle the run is left
    out, saying why; and a bundle that fails does not hide a later one of the same run."""
    import json

    from bundles.bundlefile import entries_of, records, replace_records, rewrite
    from bundles.bundlefile import resign_run as resign_bundle
    from click.testing import CliRunner
    from ledger.attacker import Row, resign_run

    from holedger.cli import cli
    from holedger.ledger.keys import SigningKey
    from holedger.protocol import rules
    from holedger.schemas.canonical import rational_to_str

    settings, _, info = server_run
    runner = CliRunner()
    run_file, base_file = tmp_path / "run.hlb", tmp_path / "base.hlb"
    export = ["export", info["run_id"], "-o", str(run_file), "--baseline-output", str(base_file)]
    assert runner.invoke(cli, ["--home", str(settings.home), *export]).exit_code == 0
    key = SigningKey.load(settings.key_path)
    entries = entries_of(run_file)
    rows = [Row(0, i + 1, "", raw) for i, raw in enumerate(records(entries))]
    scored = next(
        parse_record(r.state).payload for r in rows if parse_record(r.state).type == "RunScored"
    )
    forged_e0 = Fraction(1, 4)
    gain = rules.normalized_gain(Fraction(scored["e_h_plus"]), forged_e0)

    def pin(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event_type == "RunOpened":
            return {
                **payload,
                "seed_baseline": {**payload["seed_baseline"], "e_h0": rational_to_str(forged_e0)},
            }
        if event_type == "RunScored":
            g = None if gain is None else rational_to_str(gain)
            return {**payload, "e_h0": rational_to_str(forged_e0), "g": g}
        return payload

    forged = tmp_path / "forged.hlb"
    rewrite(run_file, forged, replace_records(entries, resign_run(rows, key, edit=pin)))
    stranger = tmp_path / "stranger.hlb"  # the same run under another key
    rewrite(
        run_file,
        stranger,
        replace_records(entries, resign_bundle(records(entries), SigningKey.generate("x"))),
    )

    def analyse(*files: Path) -> tuple[dict[str, Any], str]:
        args = ["analysis", "gains", "--verify", "--trusted-key", key.public.vkey()]
        bundles = [a for f in files for a in ("--bundle", str(f))]
        result = runner.invoke(cli, [*args, *bundles, "--json"])
        assert result.exit_code == 0, result.output
        text = runner.invoke(cli, [*args, *bundles]).output
        return json.loads(result.stdout), text

    data, _ = analyse(run_file, base_file)
    assert [r["run_id"] for r in data["runs"]] == [info["run_id"]] and data["excluded"] == []
    assert data["runs"][0]["baseline_run_id"] == info["baseline_run_id"]
    data, _ = analyse(forged, base_file)
    assert data["runs"] == [] and data["excluded"] == [info["run_id"]]
    data, text = analyse(run_file)
    assert data["runs"] == [] and data["excluded"] == [info["run_id"]]
    assert "the bundle of the seed-baseline run its E(H0) is pinned to was not given" in text
    for order in ((stranger, run_file, base_file), (run_file, stranger, base_file)):
        data, _ = analyse(*order)
        assert [r["run_id"] for r in data["runs"]] == [info["run_id"]], order
        assert data["excluded"] == []


def _operator_vkey(settings: Settings) -> str:
    from holedger.ledger.keys import SigningKey

    return SigningKey.load(settings.key_path).public.vkey()


def test_a_seed_baseline_run_must_score_the_seed_against_itself(
    server_run: tuple[Settings, ServerTask, dict[str, Any]],
) -> None:
    """A seed-baseline run pins no baseline: its E(H0) is its own E(H+). Re-signed with
    another E(H0) (and g to match), the scores check fails."""
    from ledger.attacker import resign_run

    from holedger.ledger.keys import SigningKey
    from holedger.replay.runs import LedgerBlobs, verify_records

    settings, task, info = server_run
    key = SigningKey.load(settings.key_path)

    def lower(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        if event_type == "RunScored":
            return {**payload, "e_h0": "0.5", "g": "-1"}  # E(H+) is 0
        return payload

    ledger = Ledger.open(settings.ledger_url, None, create_tables=False)
    try:
        baseline = info["baseline_run_id"]
        honest = verify_records(
            baseline,
            resign_run(_records(ledger, baseline), key),
            LedgerBlobs(ledger),
            inputs=CheckInputs(task_data=_task_data(task)),
        )
        forged = resign_run(_records(ledger, baseline), key, edit=lower)
        report = verify_records(
            baseline, forged, LedgerBlobs(ledger), inputs=CheckInputs(task_data=_task_data(task))
        )
    finally:
        ledger.close()
    assert honest.verified, honest.failures
    assert report.failed_checks() == ["scores"], report.failures
    assert [f.reason for f in report.failures] == [
        "a seed-baseline run's E(H0) 0.5 is not its own E(H+) 0"
    ]
