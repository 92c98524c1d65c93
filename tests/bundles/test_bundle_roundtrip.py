"""Export then verify gives replay's verdict and report, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

# The ledger tests' realistic run (tests/ is on sys.path as the test packages' base).
from ledger.recorded_run import record_run

from holedger.bundles.export import export_bundle
from holedger.bundles.format import open_bundle
from holedger.bundles.verify import verify_bundle
from holedger.cli import cli
from holedger.config import Settings
from holedger.errors import BundleError
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.replay.inputs import CheckInputs
from holedger.replay.report import ReplayReport
from holedger.replay.runs import replay_run

from .bundlefile import entries_of, rewrite
from .conftest import CHECKPOINT_INTERVAL, SampleRun, record_sample

BUNDLE_ONLY = {"git", "git_history", "bundle_keys", "published_checkpoints", "witnesses"}


def _core(report: ReplayReport) -> dict[str, object]:
    data = report.to_json()
    data["checks"] = [c for c in data["checks"] if c["name"] not in BUNDLE_ONLY]
    data["warnings"] = [name for name in data["warnings"] if name not in BUNDLE_ONLY]
    for section in ("git", "bundle", "checkpoint_notes"):
        data.pop(section, None)
    return data


def assert_same_as_replay(
    ledger: Ledger, run_id: str, bundle: Path, repo: Path | None = None
) -> ReplayReport:
    """The bundle verifies as the run replays; with the candidates' history bundled, as
    it replays beside its repository (both scan the candidates)."""
    replayed = replay_run(ledger, run_id, inputs=CheckInputs(run_repo=repo))
    verified = verify_bundle(bundle)
    assert _core(verified) == _core(replayed)
    assert verified.verified == replayed.verified
    return verified


def test_sample_run_round_trip_on_sqlite(sample: SampleRun, tmp_path: Path) -> None:
    out = tmp_path / "run.hlb"
    summary = export_bundle(sample.ledger, sample.run_id, out, repo_path=sample.repo)
    assert summary.events == len(list(sample.ledger.raw_records(sample.run_id)))
    assert summary.blobs == len(sample.blobs) and summary.git_objects > len(sample.commits)
    report = assert_same_as_replay(sample.ledger, sample.run_id, out, sample.repo)
    assert report.verified
    assert report.sections["git"]["candidates_checked"] == len(sample.commits)
    assert report.sections["bundle"]["sha256"] == summary.digest


def test_records_in_the_bundle_are_the_stored_bytes(sample: SampleRun, tmp_path: Path) -> None:
    out = tmp_path / "run.hlb"
    export_bundle(sample.ledger, sample.run_id, out, repo_path=sample.repo)
    with open_bundle(out) as bundle:
        assert list(bundle.records()) == [
            raw for _, raw in sample.ledger.raw_records(sample.run_id)
        ]
        assert bundle.keys["server"] == sample.key.public


def test_failing_run_gives_the_same_failing_report(tmp_path: Path) -> None:
    # The ledger tests' synthetic run fails several projections: the bundle must say the same.
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("op"))
    try:
        run_id = record_run(ledger, rounds=3)
        export_bundle(ledger, run_id, tmp_path / "run.hlb")
        report = assert_same_as_replay(ledger, run_id, tmp_path / "run.hlb")
        assert not report.verified and report.failures
    finally:
        ledger.close()


@pytest.mark.postgres
def test_round_trip_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    settings = Settings.resolve(tmp_path / "home", pg_url)
    key = SigningKey.generate("holedger-operator")
    ledger = Ledger.open(pg_url, key, checkpoint_interval=CHECKPOINT_INTERVAL)
    try:
        run = record_sample(ledger, settings, candidates=3, pad=12)
        out = tmp_path / "pg.hlb"
        export_bundle(ledger, run.run_id, out, repo_path=run.repo)
        assert assert_same_as_replay(ledger, run.run_id, out, run.repo).verified
        other = record_run(ledger, rounds=2, task_id="pg-other")
        export_bundle(ledger, other, tmp_path / "other.hlb")
        assert not assert_same_as_replay(ledger, other, tmp_path / "other.hlb").verified
    finally:
        ledger.close()


def test_redacted_bundle_verifies_everything_but_the_bodies(
    sample: SampleRun, tmp_path: Path
) -> None:
    full = tmp_path / "full.hlb"
    red = tmp_path / "redacted.hlb"
    export_bundle(sample.ledger, sample.run_id, full, repo_path=sample.repo)
    summary = export_bundle(sample.ledger, sample.run_id, red, repo_path=sample.repo, redact=True)
    assert summary.redacted == len(sample.blobs) and summary.blobs == 0
    body = sample.ledger.get_blob(sample.blobs[0])
    assert body in full.read_bytes() and body not in red.read_bytes()
    report = verify_bundle(red)
    assert report.verified
    assert (
        report.sections["redacted"] == {"blobs": len(sample.blobs)} == {"blobs": summary.redacted}
    )
    blobs = next(c for c in report.checks if c.name == "blobs")
    assert "redacted" in blobs.detail and "not checked" in blobs.detail
    assert report.sections["bundle"]["redacted"] is True


def test_run_without_candidate_history_says_so(sample: SampleRun, tmp_path: Path) -> None:
    out = tmp_path / "nogit.hlb"
    export_bundle(sample.ledger, sample.run_id, out, repo_path=None)
    report = verify_bundle(out)
    assert report.verified
    assert report.sections["git"] == {"included": False, "candidates": len(sample.commits)}
    git = next(c for c in report.checks if c.name == "git")
    assert "not re-checked" in git.detail
    # The verdict stands (the log is whole), but a reviewer is told what is not checked.
    history = next(c for c in report.checks if c.name == "git_history")
    assert history.level == "warning" and not history.ok
    assert "scan for hard-coded test answers cannot be checked" in history.detail
    whole = tmp_path / "whole.hlb"
    export_bundle(sample.ledger, sample.run_id, whole, repo_path=sample.repo)
    assert "git_history" not in [c.name for c in verify_bundle(whole).checks]


# ------------------------------------------------------------------------ command line


@pytest.fixture()
def runner() -> Iterator[CliRunner]:
    yield CliRunner()


def _invoke(runner: CliRunner, sample: SampleRun, *args: str) -> tuple[int, str]:
    result = runner.invoke(cli, ["--home", str(sample.settings.home), *args])
    return result.exit_code, result.output


def test_cli_export_and_verify_exit_codes(
    runner: CliRunner, sample: SampleRun, tmp_path: Path
) -> None:
    out = tmp_path / "cli.hlb"
    code, text = _invoke(runner, sample, "export", sample.run_id[:8], "-o", str(out), "--json")
    assert code == 0, text
    assert json.loads(text)["events"] > 20
    code, text = _invoke(runner, sample, "verify", str(out), "--json")
    assert code == 0, text
    cli_report = json.loads(text)
    code, text = _invoke(runner, sample, "replay", sample.run_id, "--json")
    replayed = json.loads(text)
    assert cli_report["verified"] is replayed["verified"] is True
    assert [c for c in cli_report["checks"] if c["name"] not in BUNDLE_ONLY] == replayed["checks"]
    pinned = sample.key.public.vkey()
    code, text = _invoke(runner, sample, "verify", str(out), "--trusted-key", pinned)
    assert code == 0 and "VERIFIED" in text
    stranger = SigningKey.generate("holedger-operator").public.vkey()
    code, text = _invoke(runner, sample, "verify", str(out), "--trusted-key", stranger)
    assert code == 1 and "FAILED" in text


def test_cli_refuses_unknown_versions_and_malformed_files(
    runner: CliRunner, sample: SampleRun, tmp_path: Path
) -> None:
    out = tmp_path / "cli.hlb"
    export_bundle(sample.ledger, sample.run_id, out, repo_path=sample.repo)
    future = rewrite(out, tmp_path / "v2.hlb", entries_of(out), version=2)
    code, text = _invoke(runner, sample, "verify", str(future))
    assert code == 2 and "version 2 is not supported" in text
    assert text.count("\n") == 1 and "Traceback" not in text
    junk = tmp_path / "junk.hlb"
    junk.write_bytes(b"not a bundle at all")
    code, text = _invoke(runner, sample, "verify", str(junk))
    assert code == 2 and "malformed bundle" in text
    code, text = _invoke(runner, sample, "verify", str(tmp_path / "absent.hlb"))
    assert code == 2 and "no bundle" in text
    with pytest.raises(BundleError, match="not supported"):
        verify_bundle(future)
