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


def _tree_files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".txt") and "__pycache__" not in p.parts
    }


def test_levers_of_a_run_read_from_its_ledger_and_from_its_bundle_agree(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner
    from replay_protocol.runs import (
        DEV,
        VAL,
        RunWriter,
        commit_files,
        honest_finish,
        new_repo,
        terms,
    )

    from holedger.cli import cli
    from holedger.config import Settings
    from holedger.ledger.store import Ledger
    from holedger.schemas.events import CandidateCommitted, OptimizerDescriptor

    home = tmp_path / "home"
    runner = CliRunner()
    assert runner.invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    cfg = Settings.resolve(home)
    ledger = Ledger.from_settings(cfg)
    by_name = {e.name: e for e in EDITS}
    seed_files = _tree_files(TASK.seed_dir)
    tree = tmp_path / "cand"
    shutil.copytree(TASK.seed_dir, tree)
    by_name["01-task-prompt"].apply(tree)
    first_files = _tree_files(tree)
    by_name["06-step-cap"].apply(tree)
    by_name["09-preretrieve-reports"].apply(tree)
    second_files = _tree_files(tree)
    t = terms().model_copy(update={"task_id": "officeqa-lite"})
    d = OptimizerDescriptor(model="A", harness="oc", harness_scope="common")
    writer = RunWriter(ledger, t.model_copy(update={"seed_commit": "0" * 40}), descriptor=d)
    repo_path = cfg.run_repo(writer.run_id)
    repo = new_repo(repo_path)
    seed, seed_tree = commit_files(repo, seed_files)
    first, first_tree = commit_files(repo, first_files, parent=seed)
    second, second_tree = commit_files(repo, second_files, parent=first)
    for index, (commit, tr, parent, paths) in enumerate(
        [
            (seed, seed_tree, None, sorted(seed_files)),
            (first, first_tree, seed, [MAIN]),
            (second, second_tree, first, [MAIN]),
        ]
    ):
        writer.append(
            "CandidateCommitted",
            CandidateCommitted(
                candidate=commit,
                index=index,
                tree=tr,
                parent=parent,
                changed_paths=paths,
                immutable_ok=True,
            ),
        )
    writer.evaluate(second, "dev", [c.id for c in DEV], 1)
    writer.evaluate(second, "val", [c.id for c in VAL[:5]], 1)
    honest_finish(writer, second)
    at_home = ["--home", str(home), "analysis", "levers", "--json"]
    result = runner.invoke(cli, at_home)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["runs"]
    assert row["levers_modified"] == ["prompt", "retrieval", "step_cap"]
    assert (row["breadth_modified"], row["candidates"], row["edits"]) == (3, 2, 3)
    assert row["levers_examined"] is None  # no read events recorded: modified only
    assert row["levers_touched"] == row["levers_modified"]
    bundle = tmp_path / "run.hlb"
    assert (
        runner.invoke(
            cli, ["--home", str(home), "export", writer.run_id, "-o", str(bundle)]
        ).exit_code
        == 0
    )
    args = [
        "--home",
        str(tmp_path / "nowhere"),
        "analysis",
        "levers",
        "--bundle",
        str(bundle),
        "--no-verify",
        "--json",
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    (from_bundle,) = json.loads(result.output)["runs"]
    assert from_bundle == row
