"""The window after RunClosed, as the server's key holder would use it: an event of the
run moved past RunClosed (a late RunScored, a held-out trial, an optimizer's read), the
whole run re-signed, re-chained and its checkpoints recomputed. Only an audit's control
evaluations may follow RunClosed; anything else fails replay's ``closed`` check at its
seq, and a control evaluation that claims one of the run's own requests fails
``audit_controls``."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import pytest
from ledger.attacker import Attacker, resign_run

from holedger.ledger.fastpath import parse_record
from holedger.ledger.records import utc_now
from holedger.ledger.store import Ledger
from holedger.protocol.runs import control_scores_digest
from holedger.replay.report import ReplayReport
from holedger.schemas.events import (
    AuditControlEvaluated,
    CandidateNominated,
    ControlScore,
    OptimizerRead,
    ReadItem,
    SafetyViolation,
)

from .runs import DEV, RunWriter, checks, failures_of, honest_search, terms

SEED = "a" * 40
CAND = "b" * 40
AUDIT = "11111111-2222-4333-8444-555555555555"


def _run(ledger: Ledger) -> RunWriter:
    """A finished run with one read recorded after its nomination and held-out scoring."""
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    writer.nominate(CAND)
    writer.heldout(CAND)
    scored = writer.scored(CAND)
    item = ReadItem(kind="budget", after_seq=scored, time=utc_now())
    writer.append("OptimizerRead", OptimizerRead(reads=[item]))
    writer.close()
    return writer


def _move_after_close(ledger: Ledger, run_id: str, etype: str, *, last: bool) -> int:
    """Move the run's last ``etype`` event to just after RunClosed (before its final
    Checkpoint, or at the very end when ``last``), re-sign the whole run with the server's
    key and write it over the stored run: the seq it lands at."""
    attacker = Attacker(ledger.url)
    try:
        rows = attacker.rows(run_id)
        types = [parse_record(r.state).type for r in rows]
        moved = rows.pop(len(types) - 1 - types[::-1].index(etype))
        closed = [parse_record(r.state).type for r in rows].index("RunClosed")
        at = len(rows) if last else closed + 1
        rows.insert(at, moved)
        forged = resign_run(rows, ledger.signers["server"], renumber=True)
        for version, raw in enumerate(forged):
            attacker.set_state(run_id, version, raw)
    finally:
        attacker.close()
    return at


@pytest.mark.parametrize("etype", ["RunScored", "TrialCompleted", "OptimizerRead"])
@pytest.mark.parametrize("last", [False, True])
def test_an_event_moved_past_run_closed_fails_closed(
    ledger: Ledger, replay: Callable[..., ReplayReport], etype: str, last: bool
) -> None:
    writer = _run(ledger)
    assert replay(writer.run_id).verified
    seq = _move_after_close(ledger, writer.run_id, etype, last=last)
    report = replay(writer.run_id)
    assert not report.verified
    assert not checks(report)["closed"], report.failures
    assert f"{seq}:{etype}:event after RunClosed" in failures_of(report, "closed")


def test_a_control_evaluation_that_is_one_of_the_runs_requests_fails_audit_controls(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    """A post-close control evaluation passing off one of the run's own (projected)
    requests, run in the run itself, as an audit's control."""
    writer = _run(ledger)
    scores = [
        ControlScore(trial_id=f"t{i}", case_id=c.id, attempt=0, score=Fraction(1))
        for i, c in enumerate(DEV[:2])
    ]
    control = AuditControlEvaluated(
        audit_id=AUDIT,
        auditor_key_id="0badc0de",
        harness="H0",
        candidate=SEED,
        split="dev",
        case_ids=[c.id for c in DEV[:2]],
        attempts=1,
        control_run_id=writer.run_id,
        control_size=1,
        control_root="0" * 64,
        request_id="req-1",  # the run's first request, shown to its optimizer
        scores=scores,
        scores_digest=control_scores_digest((s.case_id, s.attempt, s.score) for s in scores),
    )
    (rec, _) = ledger.append_many(writer.run_id, [("AuditControlEvaluated", control, "server")])
    report = replay(writer.run_id)
    assert {n for n, ok in checks(report).items() if not ok} == {"audit_controls"}
    what = f"{rec.seq}:AuditControlEvaluated:control evaluation req-1 of audit {AUDIT}"
    # The request's own projection (seq 8) now reads as a control trial shown to the
    # optimizer too: the same forgery, seen from the disclosure side.
    shown = (
        f"8:DisclosureProjected:DisclosureProjected names control run {writer.run_id} or its "
        f"request req-1 of audit {AUDIT}: a control trial was shown to the optimizer"
    )
    assert failures_of(report, "audit_controls") == [
        shown,
        f"{what} is a request of this run: its projection was shown to the optimizer",
        f"{what} names this run as its control run: it ran in the run",
    ]


def test_a_nomination_signed_by_the_gateway_role_fails_roles(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    """With keys held apart, the gateway's key speaks for calls only: a RunScored (or any
    event but GatewayCall and SafetyViolation) signed by the gateway role fails."""
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    seq = writer.append("CandidateNominated", CandidateNominated(candidate=CAND), role="gateway")
    writer.nominated = True
    writer.heldout(CAND)
    writer.scored(CAND)
    writer.close()
    report = replay(writer.run_id)
    assert {n for n, ok in checks(report).items() if not ok} == {"roles"}, report.failures
    assert failures_of(report, "roles") == [
        f"{seq}:CandidateNominated:CandidateNominated signed by the gateway: only the "
        "server signs it"
    ]


def test_the_sandbox_role_signs_safety_violations_only(
    ledger: Ledger, replay: Callable[..., ReplayReport]
) -> None:
    """The sandbox's key speaks for what it saw a harness attempt: a SafetyViolation it
    signs verifies; a nomination it signs fails ``roles``."""
    writer = RunWriter(ledger, terms(seed_commit=SEED))
    honest_search(writer, SEED, CAND)
    evidence = ledger.put_blob(b"a write to a read-only path")
    writer.append(
        "SafetyViolation",
        SafetyViolation(
            category="readonly_write",
            trial_id="trial-x",
            detail="write to a read-only path",
            evidence_digest=evidence,
        ),
        role="sandbox",
    )
    seq = writer.append("CandidateNominated", CandidateNominated(candidate=CAND), role="sandbox")
    writer.nominated = True
    writer.heldout(CAND)
    writer.scored(CAND)
    writer.close()
    report = replay(writer.run_id)
    assert failures_of(report, "roles") == [
        f"{seq}:CandidateNominated:CandidateNominated signed by the sandbox: only the "
        "server signs it"
    ]
