"""Run bundles handed to an analysis as a user's shell hands them: a glob after --bundle
(`--bundle runs/*.hlb` is `--bundle a.hlb b.hlb ...`), files in any order, one file twice;
and files that are not bundles (empty, cut short, another archive, a directory): one line
on stderr with a hint, exit 2, nothing written."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_protocol.runs import RunWriter, honest_finish, honest_search, terms

from holedger.bundles.export import export_bundle
from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.schemas.events import OptimizerDescriptor

SEED = "a" * 40


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("bundles")
    cfg = Settings.resolve(root / "home")
    Ledger.init_home(cfg)
    ledger = Ledger.from_settings(cfg)
    paths = []
    for i, model in enumerate(("m-a", "m-b", "m-c")):
        d = OptimizerDescriptor(model=model, harness="oc", harness_scope="common")
        writer = RunWriter(ledger, terms(seed_commit=SEED), descriptor=d)
        cand = f"{i + 1:040x}"
        honest_search(writer, SEED, cand)
        honest_finish(writer, cand)
        paths.append(root / f"{model}.hlb")
        export_bundle(ledger, writer.run_id, paths[-1])
    ledger.close()
    return paths


def _grid(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    home = tmp_path / "home"
    result = CliRunner().invoke(cli, ["--home", str(home), "analysis", "grid", *args])
    assert not home.exists()  # reading bundles writes nothing
    return result.exit_code, result.stdout, result.stderr


def _models(out: str) -> list[str]:
    return sorted(c["model"] for c in json.loads(out)["cells"])


def test_every_file_of_a_glob_after_bundle_is_read(tmp_path: Path, bundles: list[Path]) -> None:
    code, out, err = _grid(tmp_path, "--bundle", *map(str, bundles), "--json")
    assert code == 0, err
    assert _models(out) == ["m-a", "m-b", "m-c"]
    assert json.loads(out)["verified"] is True


def test_bundles_before_and_after_the_option_are_all_read(
    tmp_path: Path, bundles: list[Path]
) -> None:
    a, b, c = map(str, bundles)
    for args in ([a, "--bundle", b, c], [a, b, "--json", "--bundle", c], [a, b, c]):
        code, out, err = (
            _grid(tmp_path, *args, "--json") if "--json" not in args else _grid(tmp_path, *args)
        )
        assert code == 0, err
        assert _models(out) == ["m-a", "m-b", "m-c"], args


def test_one_bundle_given_twice_counts_once(tmp_path: Path, bundles: list[Path]) -> None:
    code, out, _ = _grid(tmp_path, "--bundle", str(bundles[0]), str(bundles[0]), "--json")
    assert code == 0
    assert [len(c["runs"]) for c in json.loads(out)["cells"]] == [1]


def test_the_report_of_a_glob_has_every_run(tmp_path: Path, bundles: list[Path]) -> None:
    page = tmp_path / "grid.html"
    args = ["--home", str(tmp_path / "h"), "analysis", "report", "--bundle"]
    result = CliRunner().invoke(cli, [*args, *map(str, bundles), "-o", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert all(m in html for m in ("m-a", "m-b", "m-c"))


def _not_bundles(root: Path, good: Path) -> dict[str, tuple[Path, str]]:
    whole = good.read_bytes()
    (root / "empty.hlb").write_bytes(b"")
    (root / "cut.hlb").write_bytes(whole[: len(whole) // 3])
    (root / "cut-late.hlb").write_bytes(whole[:-100])
    (root / "notes.hlb").write_text("a bundle, honest\n")
    with zipfile.ZipFile(root / "zip.hlb", "w") as archive:
        archive.writestr("events.jsonl", "{}")
    (root / "dir.hlb").mkdir()
    return {
        "empty": (root / "empty.hlb", "empty.hlb: malformed bundle"),
        "cut": (root / "cut.hlb", "cut.hlb: malformed bundle"),
        "cut-late": (root / "cut-late.hlb", "cut-late.hlb: malformed bundle"),
        "text": (root / "notes.hlb", "notes.hlb: malformed bundle"),
        "zip": (root / "zip.hlb", "zip.hlb: malformed bundle"),
        "directory": (root / "dir.hlb", "dir.hlb' is a directory"),
        "missing": (root / "gone.hlb", "gone.hlb' does not exist"),
    }


@pytest.mark.parametrize(
    "kind", ["empty", "cut", "cut-late", "text", "zip", "directory", "missing"]
)
@pytest.mark.parametrize("where", ["option", "after"])
def test_a_file_that_is_not_a_bundle_is_one_line_with_a_hint(
    tmp_path: Path, bundles: list[Path], kind: str, where: str
) -> None:
    path, needle = _not_bundles(tmp_path, bundles[0])[kind]
    args = ["--bundle", str(bundles[0]), str(path)]
    if where == "option":
        args = ["--bundle", str(path), "--bundle", str(bundles[0])]
    code, out, err = _grid(tmp_path, *args)
    assert code == 2, out
    assert needle in err and "(hint: " in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
