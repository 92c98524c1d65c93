"""Control evaluations as the audited run records them: AuditControlEvaluated events after
its RunClosed, server-signed, each batch closed by a Checkpoint. The writer refuses any
other form; replay's ``audit_controls`` check and the audit's ``controls_signed`` and
``controls_undisclosed`` name each attack on them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import pytest
from ledger.attacker import Attacker, resign_run

from holedger.errors import RunClosedError, UsageError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.protocol.runs import control_scores_digest
from holedger.replay.runs import replay_run
from holedger.schemas.events import (
    AuditControlEvaluated,
    ControlOf,
    ControlScore,
    OptimizerRead,
    ReadItem,
)
from holedger.server.lifecycle import OpenedRun

from .conftest import AuditedRun, service

AUDIT = "11111111-2222-4333-8444-555555555555"
CONTROL_RUN = "66666666-7777-4888-9999-aaaaaaaaaaaa"


def statement(seed: str, scores: list[tuple[str, int, int]]) -> AuditControlEvaluated:
    rows = [
        ControlScore(trial_id=f"t{i}", case_id=c, attempt=a, score=Fraction(s))
        for i, (c, a, s) in enumerate(scores)
    ]
    return AuditControlEvaluated(
        audit_id=AUDIT,
        auditor_key_id="0badc0de",
        harness="H0",
        candidate=seed,
        split="dev",
        case_ids=sorted({c for c, _, _ in scores}),
        attempts=max(a for _, a, _ in scores) + 1,
        control_run_id=CONTROL_RUN,  # a control run of its own, never the audited run
        control_size=1,
        control_root="0" * 64,
        request_id="control-request",
        scores=rows,
        scores_digest=control_scores_digest((r.case_id, r.attempt, r.score) for r in rows),
    )


@pytest.fixture
def small_run(audited: AuditedRun, ledger: Ledger) -> Iterator[tuple[str, str]]:
    """A fresh run of the tiny task (no trial), open: (run id, seed commit)."""
    svc = service(audited.settings, ledger)
    try:
        opened = svc.open_run(str(audited.task_dir), optimizer="controls-form", baseline=False)
    finally:
        svc.close()
    yield opened.run_id, opened.seed_commit


def test_the_writer_takes_control_evaluations_only_after_run_closed(
    small_run: tuple[str, str], ledger: Ledger
) -> None:
    run_id, seed = small_run
    made = statement(seed, [("dev-0", 0, 1), ("dev-1", 0, 0)])
    with pytest.raises(UsageError, match="recorded only after RunClosed"):
        ledger.append(run_id, "AuditControlEvaluated", made, "server")
    ledger.close_run(run_id, reason="completed")
    with pytest.raises(RunClosedError):  # anything else stays refused
        ledger.append(run_id, "SafetyViolation", {"category": "timeout", "detail": "x"}, "server")
    with pytest.raises(RunClosedError):  # and a control evaluation not signed by the server
        ledger.append(run_id, "AuditControlEvaluated", made, "gateway")
    written = ledger.append_many(run_id, [("AuditControlEvaluated", made, "server")])
    assert [r.type for r in written] == ["AuditControlEvaluated", "Checkpoint"]
    report = replay_run(ledger, run_id)
    assert report.verified, report.failures
    # its control run is not in this ledger: not cross-checked, and said so
    assert report.sections["audit_controls"] == {
        "evaluations": 1,
        "trials": 2,
        "audits": [AUDIT],
        "cross_checked": 0,
        "control_runs_not_at_hand": [CONTROL_RUN],
        "control_runs_named_by_label": [],
    }
    [check] = [c for c in report.checks if c.name == "audit_controls"]
    assert check.ok and "1 not (control run not at hand)" in check.detail
    assert [info.state for info in ledger.runs() if info.run_id == run_id] == ["closed"]


def _swap_in(audited: AuditedRun, run_id: str, forged: list[bytes]) -> Callable[[], None]:
    attacker = Attacker(audited.settings.ledger_url)
    rows = attacker.rows(run_id)
    original = [r.state for r in rows]
    for row, raw in zip(rows, forged, strict=True):
        attacker.set_state(run_id, row.version, raw)

    def restore() -> None:
        for row, raw in zip(rows, original, strict=True):
            attacker.set_state(run_id, row.version, raw)
        attacker.close()

    return restore


def test_a_control_evaluation_recorded_before_run_closed_fails_audit_controls(
    small_run: tuple[str, str], ledger: Ledger, audited: AuditedRun
) -> None:
    run_id, seed = small_run
    ledger.close_run(run_id)
    made = statement(seed, [("dev-0", 0, 1)])
    ledger.append_many(run_id, [("AuditControlEvaluated", made, "server")])

    attacker = Attacker(audited.settings.ledger_url)
    rows = attacker.rows(run_id)
    attacker.close()
    types = [parse_record(r.state).type for r in rows]
    control = rows.pop(types.index("AuditControlEvaluated"))
    at = [parse_record(r.state).type for r in rows].index("RunClosed")
    rows.insert(at, control)  # the control evaluation moved before RunClosed, re-signed
    key = SigningKey.load(audited.settings.key_path)
    restore = _swap_in(audited, run_id, resign_run(rows, key, renumber=True))
    try:
        report = replay_run(Ledger.from_settings(audited.settings), run_id)
    finally:
        restore()
    assert report.failed_checks() == ["audit_controls"], report.failures
    assert "before RunClosed: the run's optimizer could be shown it" in report.failures[0].reason


def test_run_list_gives_the_run_closed_time_not_the_last_control_evaluations(
    small_run: tuple[str, str], ledger: Ledger, audited: AuditedRun
) -> None:
    import json

    from click.testing import CliRunner

    from holedger.cli import cli

    run_id, seed = small_run
    ledger.close_run(run_id, reason="aborted")
    ledger.append_many(
        run_id, [("AuditControlEvaluated", statement(seed, [("dev-0", 0, 1)]), "server")]
    )
    records = list(ledger.records(run_id))
    closed = next(r for r in records if r.type == "RunClosed")
    assert records[-1].type == "Checkpoint" and records[-2].type == "AuditControlEvaluated"
    assert records[-1].envelope["time"] > closed.envelope["time"]
    listed = CliRunner().invoke(
        cli, ["--home", str(audited.settings.home), "run", "list", "--json"]
    )
    assert listed.exit_code == 0, listed.output
    [row] = [r for r in json.loads(listed.output) if r["run_id"] == run_id]
    assert row["closed"] == closed.envelope["time"]
    assert row["state"] == "aborted" and row["events"] == len(records)


@pytest.mark.parametrize("named", ["control run", "control request", "control trial"])
def test_an_optimizer_read_naming_a_control_run_fails_audit_controls(
    small_run: tuple[str, str], ledger: Ledger, named: str
) -> None:
    run_id, seed = small_run
    made = statement(seed, [("dev-0", 0, 1), ("dev-1", 0, 0)])
    shown = {
        "control run": {"candidate": CONTROL_RUN},
        "control request": {"request_id": made.request_id},
        "control trial": {"request_id": made.scores[1].trial_id},
    }[named]
    last = list(ledger.records(run_id))[-1]
    read = ReadItem(kind="evaluations", after_seq=last.seq, time=last.envelope["time"], **shown)
    at = ledger.append(run_id, "OptimizerRead", OptimizerRead(reads=[read]), "server").seq
    ledger.close_run(run_id, reason="completed")
    ledger.append_many(run_id, [("AuditControlEvaluated", made, "server")])
    report = replay_run(ledger, run_id)
    assert report.failed_checks() == ["audit_controls"], report.failures
    [failure] = report.failures
    assert (failure.seq, failure.type) == (at, "OptimizerRead")
    assert f"names control run {CONTROL_RUN} or its request {made.request_id}" in failure.reason
    assert "a control trial was shown to the optimizer" in failure.reason


def test_an_optimizer_read_naming_nothing_of_the_control_run_passes(
    small_run: tuple[str, str], ledger: Ledger
) -> None:
    run_id, seed = small_run
    last = list(ledger.records(run_id))[-1]
    read = ReadItem(kind="evaluations", after_seq=last.seq, time=last.envelope["time"])
    ledger.append(run_id, "OptimizerRead", OptimizerRead(reads=[read]), "server")
    ledger.close_run(run_id, reason="completed")
    ledger.append_many(
        run_id, [("AuditControlEvaluated", statement(seed, [("dev-0", 0, 1)]), "server")]
    )
    assert replay_run(ledger, run_id).verified


def closed_run_with_control_of(audited: AuditedRun, ledger: Ledger, run_id: str) -> OpenedRun:
    """A run of the tiny task opened by the server as if a control run of audit AUDIT of
    run ``run_id`` (no trial), closed; no audit refers to it."""
    svc = service(audited.settings, ledger)
    try:
        opened = svc.open_run(
            str(audited.task_dir),
            optimizer="an-ordinary-search",
            baseline=False,
            control_of=ControlOf(audit_id=AUDIT, run_id=run_id),
        )
    finally:
        svc.close()
    ledger.close_run(opened.run_id, reason="completed")
    return opened


def test_a_run_carrying_control_of_that_no_audit_refers_to_fails_control_run(
    audited: AuditedRun, ledger: Ledger
) -> None:
    opened = closed_run_with_control_of(audited, ledger, audited.run_id)
    report = replay_run(ledger, opened.run_id)
    assert report.failed_checks() == ["control_run"], report.failures
    [failure] = report.failures
    assert failure.type == "RunOpened"
    assert f"no AuditControlEvaluated of run {audited.run_id} names this run" in failure.reason
    assert report.sections["control_run"] == {
        "audit_id": AUDIT,
        "run_id": audited.run_id,
        "audited_run_at_hand": True,
        "evaluations": 0,
    }
    # run list and run show say what it claims to be
    import json

    from click.testing import CliRunner

    from holedger.cli import cli

    home = ["--home", str(audited.settings.home)]
    listed = json.loads(CliRunner().invoke(cli, [*home, "run", "list", "--json"]).output)
    [row] = [r for r in listed if r["run_id"] == opened.run_id]
    assert row["control_of"] == {"audit_id": AUDIT, "run_id": audited.run_id}
    text = CliRunner().invoke(cli, [*home, "run", "show", opened.run_id]).output
    assert f"control run of audit {AUDIT} of run {audited.run_id}" in text


def test_a_control_run_naming_a_run_not_in_its_ledger_fails_and_its_bundle_says_so(
    audited: AuditedRun, ledger: Ledger, tmp_path: Path
) -> None:
    from holedger.bundles.export import export_bundle
    from holedger.bundles.verify import verify_bundle

    opened = closed_run_with_control_of(audited, ledger, CONTROL_RUN)  # no such run here
    report = replay_run(ledger, opened.run_id)
    assert report.failed_checks() == ["control_run"], report.failures
    assert f"run {CONTROL_RUN}: that run is not in this ledger" in report.failures[0].reason
    # the run's bundle alone: the run it names is not at hand, and the check says so
    bundle = tmp_path / "control.bundle"
    export_bundle(ledger, opened.run_id, bundle)
    alone = verify_bundle(bundle)
    assert alone.verified, alone.failures
    [check] = [c for c in alone.checks if c.name == "control_run"]
    assert "that run is not at hand, its reference to this run not checked" in check.detail
    assert alone.sections["control_run"]["audited_run_at_hand"] is False
