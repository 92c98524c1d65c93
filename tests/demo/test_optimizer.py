"""The example optimizer: a standard-library program that runs where holedger is absent."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from holedger.demo.optimizer import optimizer as opt
from holedger.demo.optimizer_log import parse_log
from holedger.demo.sandboxed import OPTIMIZER_SOURCE, prepare_optimizer_dir

TASK_ROOT = Path(__file__).resolve().parents[2] / "holedger" / "tasks" / "bundled" / "officeqa-lite"


def test_optimizer_imports_only_the_standard_library() -> None:
    tree = ast.parse(OPTIMIZER_SOURCE.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_optimizer_runs_where_holedger_is_not_importable(tmp_path: Path) -> None:
    """Isolated mode (-I) with -S: no site-packages, so no holedger, no third-party code."""
    shutil.copyfile(OPTIMIZER_SOURCE, tmp_path / "optimizer.py")
    probe = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import holedger"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    assert probe.returncode != 0  # the premise: holedger is absent here
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "optimizer.py", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--edits" in proc.stdout
    missing = subprocess.run(
        [sys.executable, "-I", "-S", "optimizer.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert missing.returncode == 2
    assert "HOLEDGER_API_URL" in missing.stderr


def test_prepared_edits_apply_in_sequence_as_the_task_room_applies_them(
    tmp_path: Path,
) -> None:
    if not (TASK_ROOT / "edits").is_dir():
        pytest.skip("the bundled task has no prepared edits")
    from holedger.tasks.edits import load_edits

    edits = opt.load_edits(TASK_ROOT / "edits", shortcuts=True)
    # the overfitting shortcut (for audits to find) is tried only when asked for
    plain = [e.name for e in opt.load_edits(TASK_ROOT / "edits")]
    assert plain == [e.name for e in edits if e.name != "10-known-dev-answers"]
    assert len(edits) >= 4
    assert len({e.lever for e in edits}) >= 4  # several levers
    tree = _text_tree(TASK_ROOT / "seed")
    reference = tmp_path / "ref"
    shutil.copytree(TASK_ROOT / "seed", reference)
    for mine, theirs in zip(edits, load_edits(TASK_ROOT, shortcuts=True), strict=True):
        assert mine.name == theirs.name
        applied = mine.apply(tree)
        assert applied is not None, f"{mine.name} does not apply"
        tree = applied
        theirs.apply(reference)
    assert tree == _text_tree(reference)
    # applying an edit twice does not apply (its old text is gone): the optimizer skips it
    assert edits[0].apply(tree) is None


def test_optimizer_tree_holds_no_test_data(tmp_path: Path) -> None:
    if not (TASK_ROOT / "cases" / "test.json").is_file():
        pytest.skip("the bundled task's test split is not in the source tree")
    import json

    folder = prepare_optimizer_dir(tmp_path, TASK_ROOT / "edits")
    text = "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())
    for case in json.loads((TASK_ROOT / "cases" / "test.json").read_text()):
        assert case["id"] not in text
        assert case["input"]["question"] not in text
    names = {p.name for p in folder.rglob("*")}
    assert "test.json" not in names and "verifier.py" not in names


def _text_tree(root: Path) -> dict[str, str]:
    """A folder's text files as the optimizer reads a tree from the API (no caches)."""
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_optimizer_commits_only_what_changed() -> None:
    before = {"a.py": "1", "b.py": "2", "c.py": "3"}
    after = {"a.py": "1", "b.py": "two", "d.py": "4"}
    assert opt.changes_between(before, after) == {"b.py": "two", "d.py": "4", "c.py": None}


def test_the_log_keeps_a_trees_paths_not_its_contents() -> None:
    """The seed's files (the demo task's corpus among them) are the optimizer's to read,
    but its log, kept beside the report, lists them by path and size only."""
    listing = {
        "candidate": "c0",
        "files": [
            {"path": "a.txt", "size": 3, "executable": False, "immutable": True, "text": "abc"}
        ],
    }
    logged = opt.without_contents(listing)
    assert logged["files"] == [{"path": "a.txt", "size": 3, "executable": False, "immutable": True}]
    assert "abc" not in str(logged) and listing["files"][0]["text"] == "abc"


def test_log_parsing_keeps_json_lines_only() -> None:
    out = b'{"path": "", "status": 200}\nnot json\n{"path": "/x"}\n{broken\n'
    assert parse_log(out) == [{"path": "", "status": 200}, {"path": "/x"}]


def test_dev_mean_is_the_mean_of_case_means() -> None:
    projection = {
        "projection": {
            "cases": {"a": {"mean": "1", "trials": []}, "b": {"mean": "1/2", "trials": []}},
            "trials": 2,
        }
    }
    assert opt.dev_mean(projection) == opt.Fraction(3, 4)
    with pytest.raises(ValueError):
        opt.dev_mean({"projection": {"cases": {}}})
