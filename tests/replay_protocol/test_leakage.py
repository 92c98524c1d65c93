"""The leakage audit: test data in what was shown, and in committed candidates, is found."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.replay.checks.leakage import Matcher, verdict
from holedger.replay.report import ReplayReport

from .runs import (
    DEV,
    SEED_FILES,
    TEST,
    RunWriter,
    checks,
    commit_files,
    failures_of,
    honest_finish,
    new_repo,
    task_data,
    terms,
)

LOOKUP_TABLE = (
    "ANSWERS = {\n" + "".join(f"    {c.id!r}: {c.expected['value']!r},\n" for c in TEST) + "}\n"
)


def _with_candidates(
    ledger: Ledger,
    tmp_path: Path,
    candidates: list[dict[str, str]],
    nominate: int = -1,
    finish: bool = True,
) -> tuple[RunWriter, Path, list[str]]:
    """A run committing the seed and ``candidates``; one dev evaluation of the candidate
    ``nominate`` picks, which is then nominated and scored (unless not ``finish``)."""
    path = tmp_path / "run.git"
    repo = new_repo(path)
    seed, seed_tree = commit_files(repo, SEED_FILES)
    writer = RunWriter(ledger, terms(seed_commit=seed))
    writer.commit(seed, seed_tree)
    ids = [seed]
    for extra in candidates:
        commit, tree = commit_files(repo, {**SEED_FILES, **extra}, parent=seed)
        writer.commit(commit, tree)
        ids.append(commit)
    writer.evaluate(ids[nominate], "dev", [DEV[0].id], 1)
    if finish:
        honest_finish(writer, ids[nominate])
    return writer, path, ids


def test_candidate_holding_the_test_answers_is_reported_and_the_seed_is_not(
    ledger: Ledger, tmp_path: Path, replay: Callable[..., ReplayReport]
) -> None:
    writer, path, ids = _with_candidates(ledger, tmp_path, [{"harness/answers.py": LOOKUP_TABLE}])
    report = replay(writer.run_id, run_repo=path)
    assert not checks(report)["candidate_scan"]
    scan = report.sections["leakage"]["candidate_scan"]
    assert scan["status"] == "done"
    (finding,) = scan["findings"]
    assert finding["candidate"] == ids[1]
    assert finding["file"] == "harness/answers.py"
    assert finding["kind"] == "lookup table"
    assert [line["line"] for line in finding["lines"]] == [2, 3, 4, 5]
    assert "case id rp-test-2" in finding["lines"][2]["matches"]
    assert "answer of rp-test-2" in finding["lines"][2]["matches"]
    # the report names test cases, never their answers
    assert TEST[2].expected["value"] not in str(report.sections["leakage"])
    assert ids[0] not in {f["candidate"] for f in scan["findings"]}
    (failure,) = failures_of(report, "candidate_scan")
    commit_seq = next(
        r.seq for r in ledger.records(writer.run_id) if r.payload.get("candidate") == ids[1]
    )
    assert failure.startswith(f"{commit_seq}:CandidateCommitted:")
    assert "harness/answers.py: lookup table" in failure and "line 2" in failure
    assert not report.verified


def test_unnominated_candidate_with_test_answers_is_a_warning(
    ledger: Ledger, tmp_path: Path, replay: Callable[..., ReplayReport]
) -> None:
    writer, path, ids = _with_candidates(
        ledger, tmp_path, [{"harness/answers.py": LOOKUP_TABLE}, {}], nominate=2
    )
    report = replay(writer.run_id, run_repo=path)
    assert report.verified, report.failures
    result = {c.name: c for c in report.checks}
    assert result["candidate_scan"].ok
    assert not result["candidate_scan_unnominated"].ok
    assert result["candidate_scan_unnominated"].level == "warning"
    assert ids[1][:12] in result["candidate_scan_unnominated"].detail
    (finding,) = report.sections["leakage"]["candidate_scan"]["findings"]
    assert finding["candidate"] == ids[1] and finding["file"] == "harness/answers.py"


def test_seed_and_ordinary_edits_are_not_reported(
    ledger: Ledger, tmp_path: Path, replay: Callable[..., ReplayReport]
) -> None:
    # numbers from the seed's own corpus, and one test answer by chance, are no evidence
    corpus_values = f"{TEST[0].expected['value']} {TEST[1].expected['value']}"
    chance = f"RETRIES = 3\nLIMIT = {TEST[3].expected['value']}\nSEEN = '{corpus_values}'\n"
    writer, path, _ = _with_candidates(
        ledger,
        tmp_path,
        [{"harness/tuning.py": chance}, {"harness/__main__.py": "print('{}')\n"}],
    )
    report = replay(writer.run_id, run_repo=path)
    assert report.verified, report.failures
    scan = report.sections["leakage"]["candidate_scan"]
    assert scan["status"] == "done" and scan["findings"] == []
    assert scan["candidates"] == 3
    detail = {c.name: c for c in report.checks}["candidate_scan"].detail
    assert detail.endswith("the nominated one holds no test answers or case ids")


def test_a_run_with_no_nomination_yet_is_said_to_have_none(
    ledger: Ledger, tmp_path: Path, replay: Callable[..., ReplayReport]
) -> None:
    writer, path, _ = _with_candidates(ledger, tmp_path, [], finish=False)
    report = replay(writer.run_id, run_repo=path)
    scan = {c.name: c for c in report.checks}["candidate_scan"]
    assert scan.ok and scan.detail.endswith("none nominated yet"), scan.detail


def test_per_item_gate_on_one_test_question_is_reported(
    ledger: Ledger, tmp_path: Path, replay: Callable[..., ReplayReport]
) -> None:
    question = TEST[2].input["question"]
    gate = f"def answer(q):\n    if q == {question!r}:\n        return 'x'\n    return None\n"
    writer, path, _ = _with_candidates(ledger, tmp_path, [{"harness/gate.py": gate}])
    report = replay(writer.run_id, run_repo=path)
    (finding,) = report.sections["leakage"]["candidate_scan"]["findings"]
    assert finding["kind"] == "per-item gate" and finding["file"] == "harness/gate.py"
    assert finding["lines"] == [{"line": 2, "matches": ["input of rp-test-2"]}]


def test_recorded_tree_that_differs_from_the_repository_is_reported(
    ledger: Ledger, tmp_path: Path, replay: Callable[..., ReplayReport]
) -> None:
    path = tmp_path / "run.git"
    repo = new_repo(path)
    seed, _ = commit_files(repo, SEED_FILES)
    writer = RunWriter(ledger, terms(seed_commit=seed))
    writer.commit(seed, "0" * 40)
    writer.close()
    failures = failures_of(replay(writer.run_id, run_repo=path), "candidate_scan")
    assert any("in the repository" in f and "in the log" in f for f in failures)


def test_test_content_in_a_disclosed_trace_is_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit="a" * 40))
    writer.commit("a" * 40)
    rid, _ = writer.request("a" * 40, "dev", [DEV[0].id], 1)
    trace = ledger.put_blob(f"debug: see {TEST[1].input['question']}\n".encode())
    writer.trial(rid, "a" * 40, "dev", DEV[0].id, 0, trace_digest=trace)
    seq = writer.project(rid, "dev")
    writer.close()
    report = replay(writer.run_id)
    assert checks(report)["disclosure"]  # the projection is what its trials imply...
    (failure,) = failures_of(report, "leakage")  # ...but it shows test data
    assert failure.startswith(f"{seq}:DisclosureProjected:") and "input of rp-test-1" in failure
    assert report.sections["leakage"]["audit"]["findings"][0]["seq"] == seq


def test_audit_is_skipped_plainly_when_the_local_task_differs(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit="a" * 40))
    writer.commit("a" * 40)
    writer.evaluate("a" * 40, "dev", [DEV[0].id], 1)
    writer.close()
    report = replay(writer.run_id, task_data=task_data(digest="e" * 64))
    assert report.verified
    audit = report.sections["leakage"]["audit"]
    assert audit["status"] == "skipped" and "not the run's pinned" in audit["reason"]
    assert len(report.sections["leakage"]["shown"]) == 1
    detail = {c.name: c.detail for c in report.checks}["leakage"]
    assert detail.startswith("audit skipped:")


def test_matcher_rules() -> None:
    matcher = Matcher(task_data())
    value = TEST[0].expected["value"]
    # whole tokens only: inside a longer number or id it is no match
    assert matcher.find(f"x = {value}1; y = 0.{value}; rp-test-01") == set()
    assert {i.label() for i in matcher.find(f"x = {value}")} == {"answer of rp-test-0"}
    assert {i.label() for i in matcher.find("'rp-test-3'")} == {"case id rp-test-3"}
    # thousands separators: "7,301" is the number 7301; "4,7301" is no number of ours
    assert {i.label() for i in matcher.find(f"{value[0]},{value[1:]}")} == {"answer of rp-test-0"}
    assert matcher.find(f"4,{value}") == set()
    # answer kinds shared with dev/val cases ("lookup") are not test content
    assert matcher.find("kind = 'lookup'") == set()
    # one or two chance answers are not a finding; three are; a case id alone is
    two = matcher.find(" ".join(c.expected["value"] for c in TEST[:2]))
    three = matcher.find(" ".join(c.expected["value"] for c in TEST[:3]))
    assert verdict(two) is None
    assert verdict(three) == "lookup table"
    assert verdict(matcher.find("rp-test-1")) == "per-item gate"


def test_test_answers_in_the_harness_own_dev_answers_are_not_called_a_leak(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    """A harness that prints corpus numbers which happen to be test answers leaks nothing."""
    writer = RunWriter(ledger, terms(seed_commit="a" * 40))
    writer.commit("a" * 40)
    ids = [c.id for c in DEV[:3]]
    rid, _ = writer.request("a" * 40, "dev", ids, 1)
    for case_id, test_case in zip(ids, TEST, strict=False):
        answer = {"answer": test_case.expected["value"]}
        digest = ledger.put_blob(rules.answer_bytes(answer))
        writer.trial(rid, "a" * 40, "dev", case_id, 0, answer_digest=digest)
    views = [
        rules.trial_view(t, {"answer": c.expected["value"]})
        for t, c in zip(writer.trials[rid], TEST, strict=False)
    ]
    _, body = rules.project("dev", writer.terms.disclosure, views)
    writer.project(rid, "dev", edit=lambda _: body)
    writer.close()
    report = replay(writer.run_id)
    assert report.verified, report.failures
    assert report.sections["leakage"]["audit"]["findings"] == []


def test_test_answers_in_the_server_part_of_a_projection_are_caught(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    writer = RunWriter(ledger, terms(seed_commit="a" * 40))
    writer.commit("a" * 40)
    rid, _ = writer.request("a" * 40, "dev", [DEV[0].id], 1)
    writer.run_trials(rid, "a" * 40, "dev", [DEV[0].id], 1)
    hint = " ".join(c.expected["value"] for c in TEST)
    seq = writer.project(rid, "dev", edit=lambda body: {**body, "hint": hint})
    writer.close()
    report = replay(writer.run_id)
    (failure,) = failures_of(report, "leakage")
    assert failure.startswith(f"{seq}:") and "answer of rp-test-0" in failure
    assert not checks(report)["disclosure"]  # the extra field is not what the trials imply


def test_an_answer_shown_by_digest_is_scanned_and_a_redacted_one_is_said_unscanned(
    ledger: Ledger,
    replay: Callable[..., ReplayReport],
    replay_redacted: Callable[[str], ReplayReport],
) -> None:
    writer = RunWriter(ledger, terms(seed_commit="a" * 40))
    writer.commit("a" * 40)
    leak = f"{TEST[0].input['question']} " + "p" * rules.MAX_SHOWN_ANSWER_BYTES
    writer.answers[(DEV[0].id, 0)] = {"answer": leak}  # too large: shown by digest
    writer.evaluate("a" * 40, "dev", [DEV[0].id], 1)
    honest_finish(writer, "a" * 40)
    (failure,) = failures_of(replay(writer.run_id), "leakage")  # its blob is scanned
    assert "input of rp-test-0" in failure
    redacted = replay_redacted(writer.run_id)
    assert checks(redacted)["leakage"]  # nothing to scan; it says so
    (detail,) = [c.detail for c in redacted.checks if c.name == "leakage"]
    assert "redacted: not scanned" in detail
    assert redacted.sections["leakage"]["audit"]["unscanned_blobs"] >= 1
