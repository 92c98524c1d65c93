"""The bundled demo task: reproducible generation, a simulator that reads it, real headroom."""

from __future__ import annotations

import filecmp
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from holedger.gateway.sim_reading import parse_question
from holedger.tasks import load_task
from holedger.tasks.edits import LEVERS, EditConflictError, load_edits

from .offline_eval import mean_score, run_trial_in_process, simulator_server

TASK = load_task("officeqa-lite")


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("oql_generate", TASK.root / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generation_is_byte_identical_to_the_shipped_files(tmp_path: Path) -> None:
    _generator().generate(tmp_path)  # type: ignore[attr-defined]
    for sub in ("cases", "seed/corpus"):
        compare = filecmp.dircmp(TASK.root / sub, tmp_path / sub)
        assert not (compare.left_only or compare.right_only or compare.diff_files), sub
        _, mismatch, errors = filecmp.cmpfiles(
            TASK.root / sub, tmp_path / sub, compare.common_files, shallow=False
        )
        assert not mismatch and not errors


def test_at_least_100_cases_split_20_40_40_with_every_kind_in_every_split() -> None:
    cases = {s: TASK.cases(s) for s in ("dev", "val", "test")}
    total = sum(len(c) for c in cases.values())
    assert total >= 100
    assert [len(cases[s]) * 5 for s in ("dev", "val", "test")] == [total, 2 * total, 2 * total]
    kinds = {s: {c.expected["kind"] for c in cases[s]} for s in cases}
    assert kinds["dev"] == kinds["val"] == kinds["test"] and len(kinds["dev"]) == 6


def test_the_simulator_parses_every_question_of_the_task() -> None:
    for split in ("dev", "val", "test"):
        for case in TASK.cases(split):
            question = parse_question(case.input["question"])
            assert question is not None, case.id
            assert question.kind == case.expected["kind"]


def test_every_edit_has_a_lever_and_applies_to_the_seed_in_any_order(tmp_path: Path) -> None:
    edits = load_edits(TASK.root)
    assert len(edits) >= 8
    assert {e.lever for e in edits} == set(LEVERS)
    trees: list[str] = []
    for order in (edits, list(reversed(edits))):
        tree = tmp_path / f"tree{len(trees)}"
        shutil.copytree(TASK.seed_dir, tree)
        for edit in order:
            assert edit.apply(tree) == ["harness/__main__.py"]
        trees.append((tree / "harness" / "__main__.py").read_text())
    assert trees[0] == trees[1]
    compile(trees[0], "harness/__main__.py", "exec")


def test_an_edit_that_no_longer_applies_is_refused_without_writing(tmp_path: Path) -> None:
    edit = next(e for e in load_edits(TASK.root) if e.lever == "step_cap")
    tree = tmp_path / "tree"
    shutil.copytree(TASK.seed_dir, tree)
    edit.apply(tree)
    before = (tree / "harness" / "__main__.py").read_text()
    with pytest.raises(EditConflictError, match="not found"):
        edit.apply(tree)
    assert (tree / "harness" / "__main__.py").read_text() == before


def _scored(split: str) -> list[tuple[dict[str, object], object]]:
    return [
        (case.input, (lambda c: lambda answer: TASK.verify(c, answer))(case))
        for case in TASK.cases(split)
    ]


@pytest.mark.slow
def test_seed_scores_about_a_third_and_all_edits_at_least_three_quarters(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    shutil.copytree(TASK.seed_dir, seed)
    seed_score = mean_score(seed, _scored("test"), k=3)  # type: ignore[arg-type]
    assert 0.30 <= seed_score <= 0.45, float(seed_score)

    best = tmp_path / "best"
    shutil.copytree(TASK.seed_dir, best)
    for edit in load_edits(TASK.root):
        edit.apply(best)
    best_score = mean_score(best, _scored("test"), k=3)  # type: ignore[arg-type]
    assert best_score >= 0.75, float(best_score)


def test_the_harness_runs_as_a_process_against_http(tmp_path: Path) -> None:
    """One real trial: ``python3 -m harness`` in the folder, the openai SDK, real HTTP."""
    best = tmp_path / "best"
    shutil.copytree(TASK.seed_dir, best)
    for edit in load_edits(TASK.root):
        edit.apply(best)
    case = TASK.cases("dev")[0]
    with simulator_server() as (base_url, calls):
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sim-trial"}
        done = subprocess.run(
            [sys.executable, "-m", "harness"],
            cwd=best,
            input=json.dumps(case.input),
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert TASK.verify(case, done.stdout) == 1
    assert calls and all(c["status"] in (200, 500, 502, 503) for c in calls)


def test_in_process_trials_match_the_verifier_contract(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    shutil.copytree(TASK.seed_dir, seed)
    with simulator_server() as (base_url, calls):
        answers = [
            run_trial_in_process(seed, case.input, base_url)
            for case in itertools.islice(TASK.cases("dev"), 6)
        ]
    assert calls
    for answer in answers:
        assert answer is None or set(answer) == {"answer"}
    assert not (seed / "harness" / "__pycache__").exists()
