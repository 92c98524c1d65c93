"""The bundled task loads and verifies; every kind of tampering is refused by name."""

from __future__ import annotations

import json
import random
import shutil
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from holedger.cli import cli
from holedger.errors import NotFoundError, UsageError, VerificationError
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import TaskTerms
from holedger.schemas.task import SPLITS
from holedger.schemas.types import Split
from holedger.tasks import digests, load_task, task_digest
from holedger.tasks.loader import Case, read_spec


def _verify(path: Path) -> tuple[int, dict[str, object], str]:
    result = CliRunner().invoke(cli, ["tasks", "verify", str(path), "--json"])
    return result.exit_code, json.loads(result.stdout), result.stderr


def _failed(report: dict[str, object]) -> set[str]:
    checks = report["checks"]
    assert isinstance(checks, list)
    return {c["name"] for c in checks if not c["ok"]}


def test_bundled_task_loads_with_its_splits_and_terms() -> None:
    task = load_task("officeqa-lite")
    sizes = {s: len(task.cases(s)) for s in ("dev", "val", "test")}
    assert sizes == {"dev": 24, "val": 48, "test": 48}
    ids = [set(c.id for c in task.cases(s)) for s in ("dev", "val", "test")]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert task.models == ["holedger-sim-1"]
    assert task.entrypoint == ["python3", "-m", "harness"]
    assert task.k == 3 and task.min_aggregate_cases == 5
    terms = task.terms()
    assert isinstance(terms, TaskTerms)
    assert terms.split_sizes == sizes
    assert terms.seed_commit == task.spec.seed.commit
    assert task_digest(task.spec) == digests.json_digest(task.spec.model_dump(mode="json"))


def test_cli_lists_shows_and_verifies_the_bundled_task() -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["tasks", "list", "--json"])
    assert listed.exit_code == 0
    assert [t["id"] for t in json.loads(listed.stdout)["tasks"]] == ["officeqa-lite"]
    shown = runner.invoke(cli, ["tasks", "show", "officeqa-lite", "--json"])
    assert json.loads(shown.stdout)["task_digest"] == load_task("officeqa-lite").digest
    verified = runner.invoke(cli, ["tasks", "verify", "officeqa-lite"])
    assert verified.exit_code == 0, verified.output
    assert "all 14 digests verified" in verified.stdout


def test_an_unknown_task_is_not_found_with_a_hint() -> None:
    with pytest.raises(NotFoundError) as caught:
        load_task("no-such-task")
    assert caught.value.hint and "officeqa-lite" in caught.value.hint
    result = CliRunner().invoke(cli, ["tasks", "show", "no-such-task"])
    assert result.exit_code == 2


def test_an_edited_verifier_is_refused(task_copy: Path) -> None:
    verifier = task_copy / "verifier.py"
    verifier.write_text(verifier.read_text().replace("Fraction(1) if", "Fraction(1) if True or"))
    code, report, stderr = _verify(task_copy)
    assert code == 1 and _failed(report) == {"verifier source"}
    assert "verifier source" in stderr
    with pytest.raises(VerificationError, match="verifier source"):
        load_task(task_copy)


def test_an_edited_expected_answer_is_refused(task_copy: Path) -> None:
    path = task_copy / "cases" / "test.json"
    cases = json.loads(path.read_text())
    cases[5]["expected"]["value"] = "1"
    path.write_text(json.dumps(cases))
    code, report, _ = _verify(task_copy)
    assert code == 1 and _failed(report) == {"cases test"}
    checks = report["checks"]
    assert isinstance(checks, list)
    detail = next(c["detail"] for c in checks if c["name"] == "cases test")
    assert cases[5]["id"] in detail and "manifest digest" in detail


def test_a_case_moved_from_test_to_dev_is_refused(task_copy: Path) -> None:
    test_path, dev_path = task_copy / "cases" / "test.json", task_copy / "cases" / "dev.json"
    test_cases, dev_cases = json.loads(test_path.read_text()), json.loads(dev_path.read_text())
    dev_cases.append(test_cases.pop())
    test_path.write_text(json.dumps(test_cases))
    dev_path.write_text(json.dumps(dev_cases))
    code, report, _ = _verify(task_copy)
    assert code == 1
    assert {"cases dev", "cases test"} <= _failed(report)


def test_a_rewritten_manifest_is_refused_against_the_pins(task_copy: Path) -> None:
    from holedger.tasks.loader import build_manifest, read_cases
    from holedger.tasks.pinning import manifest_text

    spec = read_spec(task_copy)
    cases: dict[Split, list[Case]] = {s: read_cases(task_copy, spec, s) for s in SPLITS}
    cases["dev"].append(cases["test"].pop())  # a self-consistent but different manifest
    (task_copy / "manifest.json").write_text(manifest_text(build_manifest(spec.id, cases)))
    code, report, _ = _verify(task_copy)
    assert code == 1
    assert {"pinned split dev", "pinned split test", "pinned manifest digest"} <= _failed(report)


def test_an_edited_seed_harness_is_refused(task_copy: Path) -> None:
    main = task_copy / "seed" / "harness" / "__main__.py"
    main.write_text(main.read_text() + "\n# changed\n")
    code, report, _ = _verify(task_copy)
    assert code == 1 and _failed(report) == {"seed tree", "seed commit"}


def test_the_seed_tree_digest_ignores_bytecode(task_copy: Path) -> None:
    seed = task_copy / "seed"
    before = digests.tree_digest(seed)
    (seed / "harness" / "__pycache__").mkdir()
    (seed / "harness" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert digests.tree_digest(seed) == before


def test_the_task_digest_covers_the_environment_and_terms(task_copy: Path) -> None:
    spec = read_spec(task_copy)
    changed = spec.model_copy(
        update={"environment": spec.environment.model_copy(update={"packages": ["openai>=2"]})}
    )
    assert task_digest(changed) != task_digest(spec)
    assert changed.terms().environment_digest != spec.terms().environment_digest
    assert task_digest(spec.model_copy(update={"k": 5})) != task_digest(spec)


def test_digests_follow_the_documented_definitions() -> None:
    task = load_task("officeqa-lite")
    case = task.cases("val")[0]
    record = {"id": case.id, "input": case.input, "expected": case.expected}
    assert digests.case_digest(record) == digests.sha256_hex(canonical_json(record))
    pairs = sorted([c.id, digests.case_digest(c.record())] for c in task.cases("val"))
    assert task.spec.splits.split_digests["val"] == digests.sha256_hex(canonical_json(pairs))
    splits = task.spec.splits.split_digests
    assert task.spec.splits.manifest_digest == digests.sha256_hex(
        canonical_json({"dev": splits["dev"], "val": splits["val"], "test": splits["test"]})
    )


def test_verify_scores_answers_in_the_unit_interval() -> None:
    task = load_task("officeqa-lite")
    case = task.cases("dev")[0]
    value = case.expected["value"]
    assert task.verify(case, {"answer": value}) == 1
    assert task.verify(case, json.dumps({"answer": value}).encode()) == 1
    assert task.verify(case, f'log line\n{{"answer": "{value}"}}\n') == 1
    assert task.verify(case, {"answer": f"{value} thousand"}) == 0
    assert task.verify(case, b"\xff not json") == 0
    assert task.verify(case, None) == 0


def test_a_verifier_scoring_outside_the_unit_interval_is_an_error(task_copy: Path) -> None:
    verifier = task_copy / "verifier.py"
    verifier.write_text(verifier.read_text() + "\n\ndef bad(i, e, a):\n    return Fraction(3, 2)\n")
    toml = task_copy / "task.toml"
    toml.write_text(toml.read_text().replace('function = "score"', 'function = "bad"'))
    from holedger.tasks.pinning import pin_task

    pin_task(task_copy)
    task = load_task(task_copy)
    with pytest.raises(VerificationError, match="not in \\[0, 1\\]"):
        task.verify(task.cases("dev")[0], {"answer": "1"})


def test_the_verifier_that_runs_is_the_one_that_was_hashed(task_copy: Path) -> None:
    task = load_task(task_copy)
    case = task.cases("dev")[0]
    assert task.verify(case, {"answer": "nonsense"}) == Fraction(0)
    # A swap after the check does not change what runs: the hashed bytes were compiled.
    (task_copy / "verifier.py").write_text(
        "from fractions import Fraction\ndef score(i, e, a):\n    return Fraction(1)\n"
    )
    assert task.verify(case, {"answer": "nonsense"}) == Fraction(0)


def test_held_out_answers_are_not_in_the_seed_tree() -> None:
    task = load_task("officeqa-lite")
    seed_files = {p.relative_to(task.seed_dir).as_posix() for p in task.seed_dir.rglob("*")}
    assert not any(name.startswith(("cases", "manifest")) for name in seed_files)
    test_ids = [c.id for c in task.cases("test")]
    for path in task.seed_dir.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(case_id in text for case_id in test_ids), path
            for case in task.cases("test"):
                assert case.input["question"] not in text
    assert all(
        p.is_relative_to(task.root) and not p.is_relative_to(task.seed_dir)
        for p in task.private_paths
    )


def test_pinning_an_unchanged_task_changes_nothing(task_copy: Path) -> None:
    from holedger.tasks.pinning import pin_task

    before = {p: p.read_bytes() for p in (task_copy / "task.toml", task_copy / "manifest.json")}
    pin_task(task_copy)
    assert {p: p.read_bytes() for p in before} == before
    shutil.rmtree(task_copy / "seed" / "harness")
    with pytest.raises(VerificationError):
        load_task(task_copy)


def test_paths_in_task_toml_may_not_leave_the_task_folder(task_copy: Path) -> None:
    toml = task_copy / "task.toml"
    toml.write_text(toml.read_text().replace('path = "verifier.py"', 'path = "../verifier.py"'))
    with pytest.raises(UsageError, match="leaves the task folder"):
        load_task(task_copy)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
        max_size=8,
    ),
    st.randoms(),
)
def test_a_split_digest_depends_on_its_pairs_not_their_order(
    pairs: dict[str, str], rng: random.Random
) -> None:
    items = list(pairs.items())
    shuffled = items[:]
    rng.shuffle(shuffled)
    assert digests.split_digest(items) == digests.split_digest(shuffled)
    if items:
        case_id, digest = items[0]
        flipped = ("0" if digest[0] != "0" else "1") + digest[1:]
        assert digests.split_digest([(case_id, flipped), *items[1:]]) != digests.split_digest(items)
