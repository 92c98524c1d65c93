"""Trace reading (A13) and the examined half of lever breadth (A12) from the optimizer's
recorded reads, against values worked out by hand; a run without read events says so.

Four runs of officeqa-lite (its lever rules) on a two-file seed, each committing one
candidate that changes MAX_STEPS (modified: step_cap), one dev and one val request, the
nomination. The candidates' g (from the test scores of replay_protocol.runs) are
A -1/32, B 5/32, D 7/16, C 17/32.

* A reads harness/tools.py of the seed and fetches one answer: examined {retrieval};
  actions = 1 commit + 2 requests + 1 nomination + 2 reads = 6, share 1/6;
* B reads the seed's tree with contents and fetches one answer and two traces: examined
  {prompt, step_cap, retrieval}; actions 8, output reads 3, share 3/8, 2 deep fetches;
* D reads the run info three times: examined nothing; actions 7, share 0;
* C records no read: "no read events recorded", breadth from modified levers only.

rho(share, g) over A, B, D: share ranks D 1, A 2, B 3; g ranks A 1, B 2, D 3; d = (1, 1,
-2), rho = 1 - 6 * 6 / (3 * 8) = -0.5. Breadth (touched levers / 8): A 2, B 3, D 1, C 1;
ranks A 3, B 4, D 1.5, C 1.5 against g ranks 1, 2, 3, 4: cov -3.5, var 4.5 and 5,
rho = -3.5 / sqrt(22.5).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from replay_protocol.runs import DEV, VAL, RunWriter, commit_files, honest_finish, new_repo, terms

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.records import utc_now
from holedger.ledger.store import Ledger
from holedger.schemas.events import (
    CandidateCommitted,
    OptimizerDescriptor,
    OptimizerRead,
    ReadItem,
)

SEED_FILES = {
    "harness/__main__.py": "SYSTEM_PROMPT = 'Answer.'\nMAX_STEPS = 3\n",
    "harness/tools.py": "def search(q):\n    return q\n",
}
STEPS = {"A": 5, "B": 6, "D": 11, "C": 12}  # MAX_STEPS of each run's candidate


def _run(ledger: Ledger, cfg: Settings, model: str) -> dict[str, Any]:
    t = terms().model_copy(update={"task_id": "officeqa-lite", "seed_commit": "0" * 40})
    d = OptimizerDescriptor(model=model, harness="oc", harness_scope="common")
    writer = RunWriter(ledger, t, descriptor=d)
    repo = new_repo(cfg.run_repo(writer.run_id))
    seed, seed_tree = commit_files(repo, SEED_FILES)
    files = dict(SEED_FILES)
    files["harness/__main__.py"] = f"SYSTEM_PROMPT = 'Answer.'\nMAX_STEPS = {STEPS[model]}\n"
    cand, cand_tree = commit_files(repo, files, parent=seed)
    for index, (commit, tree, parent, paths) in enumerate(
        [
            (seed, seed_tree, None, sorted(SEED_FILES)),
            (cand, cand_tree, seed, ["harness/__main__.py"]),
        ]
    ):
        payload = CandidateCommitted(
            candidate=commit,
            index=index,
            tree=tree,
            parent=parent,
            changed_paths=paths,
            immutable_ok=True,
        )
        writer.append("CandidateCommitted", payload)
    ids = [c.id for c in DEV[:2]]
    rid, _ = writer.request(cand, "dev", ids, 1)
    for i, case in enumerate(ids):
        trace = ledger.put_blob(f"trace {model} {i}".encode())
        writer.trial(rid, cand, "dev", case, 0, trace_digest=trace)
    at = writer.project(rid, "dev")
    proj = next(r for r in ledger.records(writer.run_id) if r.seq == at).payload["projection"]
    trials = [proj["cases"][c]["trials"][0] for c in ids]
    writer.evaluate(cand, "val", [c.id for c in VAL[:5]], 1)

    def read(kind: str, **fields: Any) -> ReadItem:
        return ReadItem(kind=kind, after_seq=at, time=utc_now(), **fields)  # type: ignore[arg-type]

    answer = read("blob", digest=trials[0]["answer_digest"], role="answer")
    reads = {
        "A": [read("file", candidate=seed, path="harness/tools.py"), answer],
        "B": [
            read("tree", candidate=seed, contents=True),
            answer,
            read("blob", digest=trials[0]["trace_digest"], role="trace"),
            read("blob", digest=trials[1]["trace_digest"], role="trace"),
        ],
        "D": [read("run"), read("run"), read("run")],
        "C": [],
    }[model]
    if reads:
        writer.append("OptimizerRead", OptimizerRead(reads=reads[:2]))
        if reads[2:]:
            writer.append("OptimizerRead", OptimizerRead(reads=reads[2:]))
    honest_finish(writer, cand)
    return {"run_id": writer.run_id}


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    home = tmp_path_factory.mktemp("reads") / "home"
    assert CliRunner().invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    cfg = Settings.resolve(home)
    ledger = Ledger.from_settings(cfg)
    try:
        runs = {m: _run(ledger, cfg, m)["run_id"] for m in STEPS}
    finally:
        ledger.close()
    return home, runs


def _json(home: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["--home", str(home), "analysis", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def _by_model(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["model"]: r for r in rows}


def test_trace_reading_share_and_deep_fetches_by_hand(grid: tuple[Path, dict[str, str]]) -> None:
    home, runs = grid
    data = _json(home, "trace")
    rows = _by_model(data["runs"])
    assert sorted(rows) == ["A", "B", "D"]
    assert (rows["A"]["actions"], rows["A"]["output_reads"], rows["A"]["share_exact"]) == (
        6,
        1,
        "1/6",
    )
    assert (rows["B"]["actions"], rows["B"]["output_reads"], rows["B"]["share_exact"]) == (
        8,
        3,
        "0.375",
    )
    assert (rows["D"]["actions"], rows["D"]["output_reads"], rows["D"]["share_exact"]) == (
        7,
        0,
        "0",
    )
    assert [rows[m]["trace_fetches"] for m in "ABD"] == [0, 2, 0]
    assert rows["B"]["reads_by_kind"] == {"blob": 3, "tree": 1}
    assert (data["deep_fetches"], data["cells_with_deep_fetch"], data["cells"]) == (2, 1, 3)
    assert data["spearman_share_g"]["officeqa-lite"] == pytest.approx(-0.5)
    assert data["runs_without_reads"] == [{"run": runs["C"], "why": "no read events recorded"}]


def test_lever_breadth_counts_levers_examined_or_modified(
    grid: tuple[Path, dict[str, str]],
) -> None:
    home, runs = grid
    data = _json(home, "levers")
    rows = _by_model(data["runs"])
    assert {m: r["levers_modified"] for m, r in rows.items()} == {m: ["step_cap"] for m in STEPS}
    assert rows["A"]["levers_examined"] == ["retrieval"]
    assert rows["B"]["levers_examined"] == ["prompt", "retrieval", "step_cap"]
    assert rows["D"]["levers_examined"] == [] and rows["D"]["breadth_examined"] == 0
    assert rows["C"]["levers_examined"] is None
    assert {m: r["breadth_exact"] for m, r in rows.items()} == {
        "A": "0.25",
        "B": "0.375",
        "D": "0.125",
        "C": "0.125",
    }
    rho = data["spearman_breadth_g"]["officeqa-lite"]
    assert rho == pytest.approx(-3.5 / math.sqrt(22.5))
    assert data["runs_without_reads"] == [runs["C"]]
    assert "no read events recorded in 1 of 4 runs" in data["examined_note"]


def test_the_text_output_of_trace_names_the_run_without_reads(
    grid: tuple[Path, dict[str, str]],
) -> None:
    home, runs = grid
    result = CliRunner().invoke(cli, ["--home", str(home), "analysis", "trace"])
    assert result.exit_code == 0, result.output
    assert "Spearman rho(trace-reading share, g) = -0.500" in result.output
    assert "deep fetches: 2 in total; 1 of 3 cells fetched a trace at least once" in result.output
    assert f"{runs['C'][:8]}: no read events recorded" in result.output
