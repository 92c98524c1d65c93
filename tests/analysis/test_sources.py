"""The grid read from a ledger, from bundles and from a table gives the same numbers;
runs without a descriptor, aborted runs and forged runs are left out, saying why; bad
tables and non-bundles are one-line errors naming the row or file (exit 2)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from replay_protocol.runs import RunWriter, honest_finish, honest_search, terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.schemas.events import OptimizerDescriptor, RunScored

SEED = "a" * 40
GRID = [  # (task, model, harness, scope, candidate)
    ("rp-task", "A", "oc", "common", "b" * 40),
    ("rp-task", "B", "oc", "common", "c" * 40),
    ("rp-two", "A", "oc", "common", "d" * 40),
    ("rp-two", "B", "oc", "common", "e" * 40),
    ("rp-task", "A", "codex", "native", "f" * 40),
]


def _run(ledger: Ledger, task: str, model: str, harness: str, scope: str, cand: str) -> RunWriter:
    t = terms(seed_commit=SEED)
    if task != t.task_id:
        t = t.model_copy(update={"task_id": task})
    d = OptimizerDescriptor(model=model, harness=harness, harness_scope=scope)  # type: ignore[arg-type]
    writer = RunWriter(ledger, t, descriptor=d)
    honest_search(writer, SEED, cand)
    honest_finish(writer, cand)
    return writer


@pytest.fixture
def home(tmp_path: Path) -> dict[str, Any]:
    home = tmp_path / "home"
    runner = CliRunner()
    assert runner.invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    ledger = Ledger.from_settings(Settings.resolve(home))
    writers = [_run(ledger, *row) for row in GRID]
    return {"home": home, "runner": runner, "ledger": ledger, "writers": writers, "tmp": tmp_path}


def _g(ledger: Ledger, run_id: str) -> Fraction:
    (scored,) = [r.typed_payload() for r in ledger.records(run_id) if r.type == "RunScored"]
    assert isinstance(scored, RunScored) and scored.g is not None
    return scored.g


def _invoke(runner: CliRunner, args: list[str]) -> Any:
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_ledger_bundles_and_table_give_the_same_grid_and_lambda(home: dict[str, Any]) -> None:
    runner, ledger, tmp = home["runner"], home["ledger"], home["tmp"]
    at_home = ["--home", str(home["home"]), "analysis"]
    bundles: list[str] = []
    for w in home["writers"]:
        path = tmp / f"{w.run_id}.hlb"
        assert (
            runner.invoke(cli, [*at_home[:2], "export", w.run_id, "-o", str(path)]).exit_code == 0
        )
        bundles += ["--bundle", str(path)]
    # the table, written from the signed RunScored values (exact)
    by = {
        (t, m, h): _g(ledger, w.run_id)
        for (t, m, h, _, _), w in zip(GRID, home["writers"], strict=True)
    }
    lines = ["model,harness,scope,rp-task,rp-two"]
    lines.append(f"A,oc,common,{by['rp-task', 'A', 'oc']},{by['rp-two', 'A', 'oc']}")
    lines.append(f"B,oc,common,{by['rp-task', 'B', 'oc']},{by['rp-two', 'B', 'oc']}")
    lines.append(f"A,codex,native,{by['rp-task', 'A', 'codex']},")
    table = tmp / "t.csv"
    table.write_text("\n".join(lines) + "\n")
    band = terms().resolution_band
    nowhere = ["--home", str(tmp / "nowhere"), "analysis"]
    sources = {
        "ledger": at_home,
        "bundles": [*nowhere, "?", *bundles],
        "table": [
            *nowhere,
            "?",
            "--table",
            str(table),
            "--band",
            f"rp-task={band}",
            "--band",
            f"rp-two={band}",
        ],
    }
    results: dict[str, dict[str, Any]] = {}
    for name, args in sources.items():
        for what in ("grid", "lss", "contrasts"):
            cmd = [a if a != "?" else what for a in args]
            if "?" not in args:
                cmd = [*args, what]
            results[f"{name}/{what}"] = _invoke(runner, [*cmd, "--json"])
    bundles_verified = results["bundles/grid"]
    assert bundles_verified["verified"] is True and bundles_verified["runs_left_out"] == []
    assert results["table/grid"]["verified"] is None
    assert "nothing in it is verified" in results["table/grid"]["unverified_notice"]

    def cells(data: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(c["task"], c["model"], c["harness"], c["mean_g_exact"]) for c in data["cells"]]

    assert (
        cells(results["ledger/grid"])
        == cells(results["bundles/grid"])
        == cells(results["table/grid"])
    )
    # the cell means are the signed g values
    means = {
        (c["task"], c["model"], c["harness"]): c["mean_g_exact"]
        for c in results["table/grid"]["cells"]
    }
    assert {k: Fraction(v) for k, v in means.items()} == by
    lam = {k: results[f"{k}/lss"]["lambda"] for k in sources}
    assert lam["ledger"] == lam["bundles"] == lam["table"]
    a = {t: by[t, "A", "oc"] for t in ("rp-task", "rp-two")}
    b = {t: by[t, "B", "oc"] for t in ("rp-task", "rp-two")}
    expected_a = (a["rp-task"] + a["rp-two"] - b["rp-task"] - b["rp-two"]) / 4
    assert Fraction(lam["table"]["A_exact"]) == expected_a
    harness = {k: results[f"{k}/contrasts"]["harness_effect_exact"] for k in sources}
    assert harness["ledger"] == harness["bundles"] == harness["table"]
    assert Fraction(harness["table"]) == abs(by["rp-task", "A", "codex"] - by["rp-task", "A", "oc"])


def test_forged_score_unlabelled_and_aborted_runs_are_left_out_with_reasons(
    home: dict[str, Any],
) -> None:
    runner, ledger, tmp = home["runner"], home["ledger"], home["tmp"]
    d = OptimizerDescriptor(model="C", harness="oc", harness_scope="common")
    forged = RunWriter(ledger, terms(seed_commit=SEED), descriptor=d)
    honest_search(forged, SEED, "9" * 40)
    forged.nominate("9" * 40)
    forged.heldout("9" * 40)
    forged.scored("9" * 40, e_h_plus=Fraction(1), g=Fraction(1))  # not what its trials say
    forged.close()
    unlabelled = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(unlabelled, SEED, "8" * 40)
    honest_finish(unlabelled, "8" * 40)
    aborted = RunWriter(ledger, terms(seed_commit=SEED), descriptor=d)
    honest_search(aborted, SEED, "7" * 40)
    ledger.close_run(aborted.run_id, reason="aborted", summary={"why": "stopped"})
    paths = []
    for w in (*home["writers"], forged, unlabelled, aborted):
        path = tmp / f"{w.run_id}.hlb"
        args = ["--home", str(home["home"]), "export", w.run_id, "-o", str(path)]
        assert runner.invoke(cli, args).exit_code == 0
        paths += ["--bundle", str(path)]
    base = ["--home", str(tmp / "nowhere"), "analysis", "grid", *paths]
    data = _invoke(runner, [*base, "--json"])
    why = {item["run"]: item["why"] for item in data["runs_left_out"]}
    assert "replay does not verify" in why[forged.run_id]
    assert "no optimizer descriptor" in why[unlabelled.run_id]
    assert why[aborted.run_id].startswith("aborted")
    assert forged.run_id not in {r for c in data["cells"] for r in c["runs"]}
    # without verification the forged score counts, and the output says it was not replayed
    loose = _invoke(runner, [*base, "--no-verify", "--json"])
    assert forged.run_id in {r for c in loose["cells"] for r in c["runs"]}
    text = runner.invoke(cli, base).output
    assert f"left out: {forged.run_id[:8]}: replay does not verify it" in text


BAD_TABLES = [
    ("model,s\nA,0.1\n", "missing column 'harness'"),
    ("model,harness,s\nA,oc,abc\n", "row 2, column 's': 'abc' is not a number"),
    ("model,harness,s\nA,oc,0.1\nA,oc,0.2\n", "row 3: duplicate row"),
    ("model,harness,nosuchtask\nA,oc,0.1\n", "unknown task 'nosuchtask'"),
]


@pytest.mark.parametrize(("text", "needle"), BAD_TABLES)
def test_bad_tables_are_one_line_errors_naming_the_row(
    tmp_path: Path, text: str, needle: str
) -> None:
    table = tmp_path / "bad.csv"
    table.write_text(text)
    args = [
        "--home",
        str(tmp_path / "h"),
        "analysis",
        "grid",
        "--table",
        str(table),
        "--band",
        "s=0.05",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert needle in result.output and "bad.csv" in result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) <= 2  # error + hint


def test_a_file_that_is_not_a_bundle_is_a_one_line_error(tmp_path: Path) -> None:
    fake = tmp_path / "notes.hlb"
    fake.write_text("not a bundle")
    args = ["--home", str(tmp_path / "h"), "analysis", "grid", "--bundle", str(fake)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "notes.hlb" in result.output and "Traceback" not in result.output


def test_output_from_a_table_says_first_that_nothing_is_verified(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("model,harness,s\nA,oc,0.1\nB,oc,0.3\n")
    for what in ("grid", "lss", "contrasts", "budget"):
        args = ["--home", str(tmp_path / "h"), "analysis", what, "--table", str(table)]
        result = CliRunner().invoke(cli, [*args, "--band", "s=0.05"])
        assert result.exit_code == 0, result.output
        assert result.output.splitlines()[0].startswith("UNVERIFIED: read from a published table")
        data = json.loads(CliRunner().invoke(cli, [*args, "--band", "s=0.05", "--json"]).output)
        assert data["verified"] is None and data["source"] == "table"
        assert data["unverified_notice"].startswith("UNVERIFIED")
    # a table cannot be verified: asking is bad usage
    args = ["--home", str(tmp_path / "h"), "analysis", "grid", "--table", str(table), "--verify"]
    result = CliRunner().invoke(cli, [*args, "--band", "s=0.05"])
    assert result.exit_code == 2 and "cannot be verified" in result.output
