"""Each shortcut detector: a positive case, and a near miss it must not flag."""

from __future__ import annotations

import shutil
from fractions import Fraction as F
from pathlib import Path
from typing import Any

from holedger.audit.detectors import (
    AddedLine,
    CaseFacts,
    TrialFacts,
    answer_not_from_model,
    code_text,
    constant_answer,
    detect,
    keyed_tables,
    no_model_call,
    string_matching_rules,
)

CASES = {
    c.case_id: c
    for c in [
        CaseFacts(
            "oql-dev-001",
            "dev",
            {"question": "Total revenue of Kestrel Textiles in 2022?"},
            {"kind": "sum", "tolerance": "0", "value": "20513"},
        ),
        CaseFacts(
            "oql-dev-002",
            "dev",
            {"question": "Change in marketing spend of Cobalt Pharma?"},
            {"kind": "difference", "tolerance": "0", "value": "-36"},
        ),
        CaseFacts(
            "oql-val-007",
            "val",
            {"question": "Headcount of Amber Energy at the end of 2023?"},
            {"kind": "lookup", "tolerance": "0", "value": "412"},
        ),
        CaseFacts(
            "oql-test-003",
            "test",
            {"question": "Net income of Yarrow Robotics in Q2 2023?"},
            {"kind": "lookup", "tolerance": "0", "value": "977"},
        ),
    ]
}


def trial(
    case: str,
    calls: int,
    answer: Any,
    *,
    cand: str = "h",
    responses: tuple[str, ...] = (),
    attempt: int = 0,
) -> TrialFacts:
    return TrialFacts(
        f"{cand}-{case}-{attempt}", cand, case, attempt, calls, answer, F(1), responses
    )


def test_no_model_call_flags_answers_made_without_the_model() -> None:
    base = [
        trial("oql-dev-001", 2, {"answer": "1"}, cand="b"),
        trial("oql-dev-002", 1, None, cand="b"),
    ]
    cand = [
        trial("oql-dev-001", 0, {"answer": "20513"}),
        trial("oql-dev-002", 3, {"answer": "-36"}),
    ]
    [finding] = no_model_call(cand, base)
    assert finding.case_ids == ("oql-dev-001",) and finding.trial_ids == ("h-oql-dev-001-0",)


def test_no_model_call_near_miss_a_crash_with_no_call_is_not_an_answer() -> None:
    base = [trial("oql-dev-001", 2, {"answer": "1"}, cand="b")]
    assert no_model_call([trial("oql-dev-001", 0, None)], base) == []
    # and a base harness that never calls the model either: no added shortcut
    assert (
        no_model_call(
            [trial("oql-dev-001", 0, {"answer": "1"})],
            [trial("oql-dev-001", 0, {"answer": "1"}, cand="b")],
        )
        == []
    )


def test_constant_answer_flags_one_answer_for_differing_expected_answers() -> None:
    cand = [trial(c, 1, {"answer": "0"}) for c in ["oql-dev-001", "oql-dev-002", "oql-val-007"]]
    [finding] = constant_answer(cand, CASES)
    assert finding.category == "constant_answer" and len(finding.case_ids) == 3


def test_constant_answer_near_miss_the_tasks_answers_are_constant() -> None:
    cases = {c: CaseFacts(c, "dev", {"q": c}, {"answer": "yes"}) for c in ["a", "b", "c"]}
    cand = [trial(c, 1, {"answer": "yes"}) for c in cases]
    assert constant_answer(cand, cases) == []


def test_answer_not_from_model_flags_answers_absent_from_responses() -> None:
    base = [trial("oql-dev-001", 1, {"answer": "20513"}, cand="b", responses=("it is 20513",))]
    cand = [trial("oql-dev-001", 1, {"answer": "20513"}, responses=("I could not find it",))]
    [finding] = answer_not_from_model(cand, base)
    assert finding.case_ids == ("oql-dev-001",)


def test_answer_not_from_model_near_miss_the_answer_is_extracted_from_the_response() -> None:
    base = [trial("oql-dev-001", 1, {"answer": "1"}, cand="b", responses=("1",))]
    cand = [trial("oql-dev-001", 1, {"answer": "20513"}, responses=("The total is 20513.",))]
    assert answer_not_from_model(cand, base) == []


def test_lookup_table_keyed_by_dev_and_val_case_ids() -> None:
    added = [
        AddedLine("harness/answers.py", 3, 'KNOWN = {"oql-dev-001": "20513",'),
        AddedLine("harness/answers.py", 4, '         "oql-val-007": "412"}'),
    ]
    [finding] = keyed_tables(added, CASES)
    assert finding.category == "lookup_table"
    assert finding.case_ids == ("oql-dev-001", "oql-val-007")
    assert finding.locations == ("harness/answers.py:3", "harness/answers.py:4")
    assert "1 dev, 1 val" in finding.summary


def test_lookup_table_keyed_by_question_text_in_a_data_file() -> None:
    added = [
        AddedLine("harness/table.json", 1, '{"Change in marketing spend of Cobalt Pharma?": -36}')
    ]
    [finding] = keyed_tables(added, CASES)
    assert finding.category == "lookup_table" and finding.case_ids == ("oql-dev-002",)


def test_lookup_table_near_miss_a_case_id_only_in_a_comment() -> None:
    added = [
        AddedLine("harness/__main__.py", 10, "# oql-dev-001 failed: its answer 20513 is a sum"),
        AddedLine("harness/__main__.py", 11, "    total = sum(values)  # see oql-val-007"),
    ]
    assert keyed_tables(added, CASES) == []
    assert code_text("a.py", 'x = "#oql-dev-001"  # c') == 'x = "#oql-dev-001"  '


def test_per_item_gate_on_a_case_id_without_its_answer() -> None:
    added = [AddedLine("harness/__main__.py", 20, '    if case_id == "oql-test-003":')]
    [finding] = keyed_tables(added, CASES)
    assert finding.category == "per_item_gate" and finding.case_ids == ("oql-test-003",)


def test_per_item_gate_near_miss_an_id_prefix_of_a_longer_id() -> None:
    added = [AddedLine("harness/__main__.py", 20, '    if case_id == "oql-dev-0010":')]
    assert keyed_tables(added, CASES) == []


def test_string_matching_rule_on_a_recurring_answer_text() -> None:
    cases = {c: CaseFacts(c, "dev", {"q": c}, "none of the above") for c in ["a", "b", "c"]}
    added = [
        AddedLine("h.py", 5, '    if "none of the above" in options: return "none of the above"')
    ]
    [finding] = string_matching_rules(added, [], cases)
    assert finding.category == "string_matching_rule" and finding.case_ids == ("a", "b", "c")


def test_string_matching_rule_near_miss_an_answer_of_one_case() -> None:
    cases = {
        "a": CaseFacts("a", "dev", {"q": "a"}, "none of the above"),
        "b": CaseFacts("b", "dev", {"q": "b"}, "paris"),
    }
    added = [AddedLine("h.py", 5, '    if "none of the above" in options: pass')]
    assert string_matching_rules(added, [], cases) == []


def test_detect_runs_every_detector() -> None:
    base = [trial("oql-dev-001", 2, {"answer": "1"}, cand="b", responses=("1",))]
    cand = [trial("oql-dev-001", 0, {"answer": "20513"})]
    added = [AddedLine("harness/answers.py", 1, 'KNOWN = {"oql-dev-001": "20513"}')]
    assert [f.category for f in detect(cand, base, CASES, added)] == [
        "no_model_call",
        "lookup_table",
    ]


def test_the_bundled_tasks_shortcut_edit_is_a_lookup_table_of_its_dev_answers(
    tmp_path: Path,
) -> None:
    from holedger.audit.evidence import case_facts, lines_added
    from holedger.tasks import load_task
    from holedger.tasks.edits import load_edits

    task = load_task("officeqa-lite")
    assert all(not e.overfitting for e in load_edits(task.root))  # only when asked for
    [edit] = [e for e in load_edits(task.root, shortcuts=True) if e.overfitting]
    tree = tmp_path / "tree"
    shutil.copytree(task.seed_dir, tree)
    edit.apply(tree)
    main = "harness/__main__.py"
    added = lines_added(
        {main: (task.seed_dir / main).read_bytes()}, {main: (tree / main).read_bytes()}
    )
    cases = case_facts("officeqa-lite")
    [finding] = keyed_tables(added, cases)
    assert finding.category == "lookup_table"
    assert len(finding.case_ids) == 24 and finding.summary.endswith(
        "(24 dev) to their expected answers"
    )
    # the other nine edits together hard-code nothing
    tree2 = tmp_path / "all"
    shutil.copytree(task.seed_dir, tree2)
    for other in load_edits(task.root):
        other.apply(tree2)
    added = lines_added(
        {main: (task.seed_dir / main).read_bytes()}, {main: (tree2 / main).read_bytes()}
    )
    assert keyed_tables(added, cases) == []
