"""The lever classifier recovers the bundled task's prepared edits' levers exactly, and
the levers of candidates that mix several edits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from holedger.analysis.levers import classify_change, load_rules
from holedger.tasks import load_task
from holedger.tasks.edits import LEVERS, load_edits

TASK = load_task("officeqa-lite")
EDITS = load_edits(TASK.root)
RULES = load_rules(TASK.root)
MAIN = "harness/__main__.py"


def _levers_of(tmp_path: Path, names: list[str]) -> tuple[set[str], int]:
    tree = tmp_path / "cand"
    shutil.copytree(TASK.seed_dir, tree)
    for edit in EDITS:
        if edit.name in names:
            edit.apply(tree)
    old = (TASK.seed_dir / MAIN).read_text()
    new = (tree / MAIN).read_text()
    out = classify_change(MAIN, old, new, RULES)
    return out.levers, out.unclassified


def test_every_lever_has_a_prepared_edit() -> None:
    assert {e.lever for e in EDITS} == set(LEVERS)


@pytest.mark.parametrize("edit", EDITS, ids=lambda e: e.name)
def test_each_prepared_edit_is_classified_as_its_declared_lever(edit, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    levers, unclassified = _levers_of(tmp_path, [edit.name])
    assert levers == {edit.lever}
    assert unclassified == 0


def test_a_candidate_mixing_edits_gets_each_edit_lever(tmp_path: Path) -> None:
    names = ["01-task-prompt", "06-step-cap", "09-preretrieve-reports"]
    levers, _ = _levers_of(tmp_path, names)
    assert levers == {"prompt", "step_cap", "retrieval"}


def test_all_edits_together_touch_all_eight_levers(tmp_path: Path) -> None:
    levers, unclassified = _levers_of(tmp_path, [e.name for e in EDITS])
    assert levers == set(LEVERS) and unclassified == 0


def test_without_task_rules_generic_names_classify_and_unknown_code_is_unclassified() -> None:
    old = "MAX_STEPS = 2\nFOO = 1\n"
    new = "MAX_STEPS = 6\nFOO = 2\n"
    out = classify_change("h.py", old, new, [])
    assert out.levers == {"step_cap"}
    assert out.hunks == 1  # adjacent lines: one hunk spanning both symbols
    out = classify_change("h.py", "FOO = 1\n", "FOO = 2\n", [])
    assert out.levers == set() and out.unclassified == 1
