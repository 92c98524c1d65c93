"""Importing the VeRO partitions of the four HarnessOpt-Bench tasks, and refusing bad ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.tasks.loader import check_manifest, read_manifest
from holedger.tasks.vero import VeroImportError, import_vero, partition_digest

from .conftest import VERO_TASKS

EXPECTED_SIZES = {
    "officeqa": (49, 98, 99),
    "browsecomp-plus": (33, 66, 66),
    "terminal-bench": (17, 36, 36),
    "gaia": (33, 66, 66),
}


def _copy(vero_dir: Path, task: str, tmp_path: Path) -> Path:
    dest = tmp_path / task
    shutil.copytree(vero_dir / task, dest)
    for path in dest.iterdir():
        path.chmod(0o644)
    return dest


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _dump(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2))


@pytest.mark.parametrize("task", VERO_TASKS)
def test_each_shared_partition_imports_and_its_manifest_verifies(
    vero_dir: Path, task: str, tmp_path: Path
) -> None:
    out = tmp_path / f"{task}.manifest.json"
    result = CliRunner().invoke(
        cli, ["tasks", "import-vero", str(vero_dir / task), "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert tuple(report["sizes"].values()) == EXPECTED_SIZES[task]

    manifest = read_manifest(out)
    assert all(check.ok for check in check_manifest(manifest))
    ids = [set(manifest.ids(s)) for s in ("dev", "val", "test")]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert ids[0] == set(_load(vero_dir / task / "development.json"))

    verified = CliRunner().invoke(cli, ["tasks", "verify", str(out)])
    assert verified.exit_code == 0, verified.output


def test_import_is_deterministic(vero_dir: Path) -> None:
    assert import_vero(vero_dir / "gaia") == import_vero(vero_dir / "gaia")


@pytest.mark.parametrize("task", VERO_TASKS)
def test_a_case_moved_between_split_files_is_refused(
    vero_dir: Path, task: str, tmp_path: Path
) -> None:
    folder = _copy(vero_dir, task, tmp_path)
    dev, val = folder / "development.json", folder / "validation.json"
    dev_names, val_names = _load(dev), _load(val)
    assert isinstance(dev_names, list) and isinstance(val_names, list)
    moved = dev_names.pop(0)
    _dump(dev, dev_names)
    _dump(val, [*val_names, moved])
    with pytest.raises(VeroImportError) as caught:
        import_vero(folder)
    message = str(caught.value)
    # The object-shaped manifests name the case; the plain-list one catches the counts.
    assert moved in message or "partition_counts" in message


@pytest.mark.parametrize("task", ["terminal-bench", "officeqa"])
def test_a_case_listed_twice_in_a_split_file_is_refused(
    vero_dir: Path, task: str, tmp_path: Path
) -> None:
    folder = _copy(vero_dir, task, tmp_path)
    test_file = folder / "test.json"
    names = _load(test_file)
    assert isinstance(names, list)
    _dump(test_file, [*names, names[3]])
    with pytest.raises(VeroImportError, match=f"case {names[3]} is listed twice in test.json"):
        import_vero(folder)


def test_a_case_in_two_split_files_is_refused(vero_dir: Path, tmp_path: Path) -> None:
    folder = _copy(vero_dir, "browsecomp-plus", tmp_path)
    dev_names = _load(folder / "development.json")
    val_names = _load(folder / "validation.json")
    assert isinstance(dev_names, list) and isinstance(val_names, list)
    _dump(folder / "validation.json", [*val_names, dev_names[0]])
    with pytest.raises(VeroImportError, match=r"in both development\.json and validation\.json"):
        import_vero(folder)


@pytest.mark.parametrize("task", ["terminal-bench", "gaia"])
def test_an_edited_partition_digest_is_refused(vero_dir: Path, task: str, tmp_path: Path) -> None:
    folder = _copy(vero_dir, task, tmp_path)
    manifest = _load(folder / "manifest.json")
    assert isinstance(manifest, dict)
    digest = manifest["partition_digest"]
    manifest["partition_digest"] = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    _dump(folder / "manifest.json", manifest)
    with pytest.raises(VeroImportError, match="partition_digest"):
        import_vero(folder)
    result = CliRunner().invoke(
        cli, ["tasks", "import-vero", str(folder), "--out", str(tmp_path / "x.json")]
    )
    assert result.exit_code == 1
    assert "partition_digest" in result.output


def test_the_partition_digest_is_recomputed_as_published(vero_dir: Path) -> None:
    folder = vero_dir / "terminal-bench"
    lists = {n: _load(folder / f"{n}.json") for n in ("development", "validation", "test")}
    manifest = _load(folder / "manifest.json")
    assert isinstance(manifest, dict)
    assert partition_digest(lists) == manifest["partition_digest"]


def test_a_manifest_that_places_a_case_elsewhere_is_refused(vero_dir: Path, tmp_path: Path) -> None:
    folder = _copy(vero_dir, "gaia", tmp_path)
    manifest = _load(folder / "manifest.json")
    assert isinstance(manifest, dict)
    entry = next(t for t in manifest["tasks"] if t["partition"] == "test")
    entry["partition"] = "validation"
    _dump(folder / "manifest.json", manifest)
    with pytest.raises(VeroImportError, match=f"case {entry['name']} is in test.json"):
        import_vero(folder)


def test_a_case_missing_from_the_manifest_is_refused(vero_dir: Path, tmp_path: Path) -> None:
    folder = _copy(vero_dir, "officeqa", tmp_path)
    manifest = _load(folder / "manifest.json")
    assert isinstance(manifest, dict)
    dropped = manifest["tasks"].pop()
    _dump(folder / "manifest.json", manifest)
    with pytest.raises(VeroImportError, match=f"case {dropped} is in .* but not in manifest"):
        import_vero(folder)


def test_an_edited_manifest_file_fails_verify_naming_the_split(
    vero_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "m.json"
    runner = CliRunner()
    assert (
        runner.invoke(
            cli, ["tasks", "import-vero", str(vero_dir / "gaia"), "--out", str(out)]
        ).exit_code
        == 0
    )
    data = json.loads(out.read_text())
    data["splits"]["val"].append(data["splits"]["test"].pop())
    out.write_text(json.dumps(data))
    result = runner.invoke(cli, ["tasks", "verify", str(out), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    failed = {c["name"] for c in report["checks"] if not c["ok"]}
    assert failed == {"split digest val", "split digest test"}
    assert "split digest val" in result.stderr
