"""A realistic recorded run for the ledger and replay tests, written with the Ledger API.

``record_run`` writes RunOpened, candidates, evaluations, trials with output and trace
blobs, gateway calls with request and response blobs, disclosures, a safety violation, a
nomination, held-out scores, automatic checkpoints and RunClosed: well over 200 events.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from typing import Any

from sample_terms import sha, task_terms

from holedger.ledger.store import Ledger
from holedger.schemas.events import (
    BudgetUse,
    CandidateCommitted,
    CandidateNominated,
    CaseCost,
    CaseScores,
    DisclosureProjected,
    EvaluationRequested,
    GatewayCall,
    RunScored,
    SafetyViolation,
    SplitUse,
    TokenUsage,
    TrialCompleted,
)

CHECKPOINT_INTERVAL = 32


class MemoryBlobs:
    """Blobs held in memory, for replaying records outside the database."""

    def __init__(self, blobs: dict[str, bytes]) -> None:
        self.blobs = blobs

    def blob(self, digest: str) -> bytes | None:
        return self.blobs.get(digest)

    def redacted(self, digest: str) -> bool:
        return False


def open_run(ledger: Ledger, task_id: str = "demo-task") -> str:
    return ledger.open_run(task_terms(task_id), task_digest=sha(task_id), optimizer="test-opt")


def _tokens(n: int) -> TokenUsage:
    return TokenUsage(input=100 + n, cached=10, output=20 + n, reasoning=5, total=120 + 2 * n)


def evaluation(ledger: Ledger, run_id: str, cand: str, round_no: int) -> None:
    """One dev evaluation: request, 5 trials each with 3 gateway calls, a disclosure."""
    req = f"req-{round_no}"
    cases = [f"case-{i}" for i in range(5)]
    used = Fraction(round_no * 5, 10)
    ledger.append(
        run_id,
        "EvaluationRequested",
        EvaluationRequested(
            request_id=req,
            candidate=cand,
            split="dev",
            case_ids=cases,
            attempts=1,
            cost=CaseCost(calls=1, case_passes=Fraction(1, 2)),
            budget_before=BudgetUse(
                dev=SplitUse(calls=round_no, case_passes=used),
                val=SplitUse(calls=0, case_passes=Fraction(0)),
            ),
            decision="accepted",
        ),
        "server",
    )
    for case in cases:
        trial = f"{req}-{case}"
        for call in range(3):
            request = ledger.put_blob(f"request {trial} {call}".encode())
            response = ledger.put_blob(f"response {trial} {call}".encode())
            ledger.append(
                run_id,
                "GatewayCall",
                GatewayCall(
                    call_id=f"{trial}-call-{call}",
                    scope="target",
                    request_id=req,
                    trial_id=trial,
                    case_id=case,
                    attempt=0,
                    model_requested="sim-small",
                    model_served="sim-small",
                    allowed=True,
                    status=200,
                    tokens=_tokens(call),
                    reserved=500,
                    latency_ms=12,
                    request_digest=request,
                    response_digest=response,
                ),
                "gateway",
            )
        output = ledger.put_blob(f"output of {trial}".encode())
        trace = ledger.put_blob(f"trace of {trial}".encode())
        ledger.append(
            run_id,
            "TrialCompleted",
            TrialCompleted(
                request_id=req,
                trial_id=trial,
                candidate=cand,
                split="dev",
                case_id=case,
                attempt=0,
                backend="bwrap",
                isolation="isolated",
                limits={"wall_s": 60, "memory_mb": 512},
                exit_status=0,
                timed_out=False,
                oom=False,
                wall_ms=800,
                answer_digest=None,
                output_digest=output,
                trace_digest=trace,
                score=Fraction(round_no % 3, 2),
                tokens=_tokens(3),
                gateway_calls=3,
            ),
            "sandbox",
        )
    projection: dict[str, Any] = {"cases": {c: "1/2" for c in cases}}
    ledger.append(
        run_id,
        "DisclosureProjected",
        DisclosureProjected(
            request_id=req,
            split="dev",
            policy="per_case",
            projection=projection,
            projection_digest=sha(repr(projection)),
        ),
        "server",
    )


def record_run(ledger: Ledger, rounds: int = 9, task_id: str = "demo-task") -> str:
    """Record a complete, closed run; 9 rounds give 219 events with checkpoints."""
    run_id = open_run(ledger, task_id)
    cand = ""
    for round_no in range(rounds):
        cand = hashlib.sha1(f"{run_id} cand {round_no}".encode()).hexdigest()
        ledger.append(
            run_id,
            "CandidateCommitted",
            CandidateCommitted(
                candidate=cand,
                index=round_no,
                tree=hashlib.sha1(f"tree {round_no}".encode()).hexdigest(),
                parent=None,
                changed_paths=["harness/agent.py"],
                immutable_ok=True,
            ),
            "server",
        )
        evaluation(ledger, run_id, cand, round_no)
        if round_no == 4:
            evidence = ledger.put_blob(b"tried to write /task/verifier.py")
            ledger.append(
                run_id,
                "SafetyViolation",
                SafetyViolation(
                    category="readonly_write",
                    trial_id="req-4-case-0",
                    detail="write to a read-only path",
                    evidence_digest=evidence,
                ),
                "sandbox",
            )
    ledger.append(run_id, "CandidateNominated", CandidateNominated(candidate=cand), "server")
    ledger.append(
        run_id,
        "RunScored",
        RunScored(
            candidate=cand,
            k=3,
            per_case=[
                CaseScores(case_id=f"t{i}", scores=[Fraction(1), Fraction(0), Fraction(1, 2)])
                for i in range(10)
            ],
            e_h_plus=Fraction(1, 2),
            e_h0=Fraction(1, 4),
            g=Fraction(1, 3),
        ),
        "server",
    )
    ledger.close_run(run_id, reason="completed", summary={"candidates": rounds})
    return run_id
