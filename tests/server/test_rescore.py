"""holedger rescore: a closed run's nominee scored again on the test split, each time as a
signed run of its own bound to the run (RunOpened.rescore_of) that replay verifies; the run
itself is never written to; analysis bands pairs the re-scorings with it."""

from __future__ import annotations

from click.testing import CliRunner

from holedger.analysis.sources import from_runs
from holedger.analysis.suite import bands_json
from holedger.cli import cli
from holedger.config import Settings
from holedger.errors import UsageError
from holedger.schemas.events import OptimizerDescriptor
from holedger.server.candidates import read_directory, read_file_map
from holedger.server.rescore import rescore
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .helpers import assert_replay_verifies
from .tinytask import PERFECT_MAIN


def _scored_run(service: RunService, tiny: ServerTask) -> str:
    d = OptimizerDescriptor(model="m", harness="h", harness_scope="common")
    run = service.open_run("tiny", optimizer="o", descriptor=d).run_id
    files = {p: e.data.decode() for p, e in read_directory(tiny.seed_dir).items()}
    files["harness/__main__.py"] = PERFECT_MAIN
    candidate = service.commit_candidate(run, read_file_map(files, service.tree_limits)).candidate
    scored = service.nominate(run, candidate)
    # every test case right in every attempt: the K round means are all 1, their SE 0
    assert scored.e_h_plus == 1 and scored.e_h_plus_se == "0.000000000"
    return run


def test_rescore_makes_bound_runs_that_verify_and_leaves_the_run_alone(
    service: RunService, tiny: ServerTask, home: Settings
) -> None:
    run = _scored_run(service, tiny)
    before = [r.event_hash for r in service.ledger.records(run)]
    out = rescore(service, run, 2)
    assert [r.index for r in out] == [1, 2]
    assert [r.e_h_plus for r in out] == [1, 1]
    assert [r.event_hash for r in service.ledger.records(run)] == before
    nominee = service.state(run).scored
    assert nominee is not None
    for done in out:
        report = assert_replay_verifies(service.ledger, done.run_id)
        assert report.sections["rescoring"]["run_id"] == run
        assert report.sections["rescoring"]["candidate"] == nominee.candidate
        assert {c.name for c in report.checks} >= {"rescoring", "scores", "baseline"}
    assert [r.index for r in rescore(service, run, 1)] == [3]  # indices continue
    shown = CliRunner().invoke(cli, ["--home", str(home.home), "run", "show", out[0].run_id])
    assert shown.exit_code == 0, shown.output
    assert "E(H+) 1.000 ± 0.000 (standard error of the 2 round means)" in shown.output
    assert f"re-scoring 1 of run {run}: its nominee {nominee.candidate[:12]}" in shown.output
    source = from_runs(ledger_url=home.ledger_url, runs_dir=home.runs_dir, verify=False)
    task = next(t for t in bands_json(source)["tasks"] if t["task"] == tiny.terms.task_id)
    # three pairs, each |1 - 1| / (1 - E(H0)) = 0, at K = 2: b_t = 0 * sqrt(2/3) = 0
    assert (task["rescorings"], task["rescored_runs"], task["band_from_rescorings"]) == (
        3,
        1,
        0.0,
    )


def test_what_cannot_be_rescored_is_refused_before_anything_is_recorded(
    service: RunService, tiny: ServerTask, home: Settings
) -> None:
    opened = service.open_run("tiny", optimizer="o")
    runs = len(list(service.ledger.runs()))
    for run, times, says in [
        (opened.run_id, 1, "is not closed with a held-out score"),
        (opened.run_id, 0, "--times 0 is not from 1 to 100"),
    ]:
        try:
            rescore(service, run, times)
        except UsageError as exc:
            assert says in exc.message
        else:
            raise AssertionError(f"{run} x {times} was not refused")
    assert len(list(service.ledger.runs())) == runs
    result = CliRunner().invoke(
        cli, ["--home", str(home.home), "rescore", opened.run_id, "--times", "1"]
    )
    assert result.exit_code == 2, result.output
    assert "is not closed with a held-out score" in result.output
