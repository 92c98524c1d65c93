"""A small complete run written with the low-level Ledger API, for the report tests.

It follows the protocol with the shared rules (costs, budget use, projections, scores),
so that a page about it has something in every section: candidates with dev and val
results, trials with tokens, a safety violation, a nomination, held-out scores and g.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from typing import Any

from sample_terms import sha, task_terms

from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    CaseScores,
    DisclosureProjected,
    EvaluationRequested,
    RunScored,
    SafetyViolation,
    SeedBaseline,
    TaskTerms,
    TokenUsage,
    TrialCompleted,
)

SIZES = {"dev": 6, "val": 6, "test": 5}
E_H0 = Fraction(1, 3)


def case_ids(split: str) -> list[str]:
    return [f"syn-{split}-{i:03d}" for i in range(SIZES[split])]


def terms() -> TaskTerms:
    return task_terms(
        "synthetic",
        models=["holedger-sim-1"],
        sizes=SIZES,
        calls=(10, 10),
        k=2,
        seed_commit="a" * 40,
        entrypoint=["python3", "-m", "harness"],
        immutable_paths=[],
        case_timeout_s=30,
    )


class Recorder:
    def __init__(
        self,
        ledger: Ledger,
        commits: list[str] | None = None,
        baseline_run_id: str | None = None,
    ) -> None:
        self.ledger = ledger
        self.terms = (
            terms() if not commits else terms().model_copy(update={"seed_commit": commits[0]})
        )
        self.commits = commits
        self.run_id = ledger.open_run(
            self.terms,
            task_digest=sha("synthetic task"),
            optimizer="synthetic-optimizer",
            seed_baseline=SeedBaseline(e_h0=E_H0, k=2, baseline_run_id=baseline_run_id),
        )
        self.used = rules.no_use()
        self.requests = 0

    def commit(self, index: int, parent: str | None) -> str:
        commit = hashlib.sha1(f"{self.run_id} candidate {index}".encode()).hexdigest()
        if self.commits:
            commit = self.commits[index]
        elif index == 0:
            commit = self.terms.seed_commit
        self.ledger.append(
            self.run_id,
            "CandidateCommitted",
            CandidateCommitted(
                candidate=commit,
                index=index,
                tree=hashlib.sha1(f"tree {index}".encode()).hexdigest(),
                parent=parent,
                changed_paths=[] if index == 0 else [f"harness/step{index}.py"],
                immutable_ok=True,
            ),
            "server",
        )
        return commit

    def evaluate(
        self, candidate: str, split: str, cases: list[str], scores: list[Fraction], k: int = 1
    ) -> None:
        self.requests += 1
        request_id = f"req-{self.requests}"
        cost = rules.request_cost(SIZES[split], len(cases), k)
        test = split == "test"
        self.ledger.append(
            self.run_id,
            "EvaluationRequested",
            EvaluationRequested(
                request_id=request_id,
                candidate=candidate,
                split=split,  # type: ignore[arg-type]
                case_ids=cases,
                attempts=k,
                cost=cost,
                budget_before=self.used,
                decision="accepted",
            ),
            "server",
        )
        if not test:
            self.used = rules.add_use(self.used, split, cost)
        views = []
        for i, case in enumerate(cases):
            for attempt in range(k):
                score = scores[(i + attempt) % len(scores)]
                answer: dict[str, Any] = {"answer": str(i)}
                answer_digest = self.ledger.put_blob(rules.answer_bytes(answer))
                trial = TrialCompleted(
                    request_id=request_id,
                    trial_id=f"{request_id}-{case}-{attempt}",
                    candidate=candidate,
                    split=split,  # type: ignore[arg-type]
                    case_id=case,
                    attempt=attempt,
                    backend="bwrap",
                    isolation="isolated",
                    limits={"wall_s": 30},
                    exit_status=0,
                    timed_out=False,
                    oom=False,
                    wall_ms=500 + 10 * i,
                    answer_digest=answer_digest,
                    output_digest=None,
                    trace_digest=None,
                    score=score,
                    tokens=TokenUsage(input=900 + 40 * i, output=100, total=1000 + 40 * i),
                    gateway_calls=0,
                )
                self.ledger.append(self.run_id, "TrialCompleted", trial, "server")
                views.append(rules.trial_view(trial, answer))
        if not test:
            policy, body = rules.project(split, self.terms.disclosure, views)
            self.ledger.append(
                self.run_id,
                "DisclosureProjected",
                DisclosureProjected(
                    request_id=request_id,
                    split=split,  # type: ignore[arg-type]
                    policy=policy,  # type: ignore[arg-type]
                    projection=body,
                    projection_digest=rules.projection_digest(body),
                ),
                "server",
            )


def record_synthetic_run(
    ledger: Ledger,
    *,
    close: bool = True,
    commits: list[str] | None = None,
    baseline_run_id: str | None = None,
    safety_detail: str = "slow",
) -> str:
    """Record the run; returns its id. ``commits``: the ids of candidates 0, 1, 2 (from a
    real repository) instead of made-up ones; ``baseline_run_id``: the seed-baseline run
    its E(H0) pin names."""
    rec = Recorder(ledger, commits, baseline_run_id)
    half, one = Fraction(1, 2), Fraction(1)
    seed = rec.commit(0, None)
    rec.evaluate(seed, "dev", case_ids("dev")[:3], [Fraction(0), half])
    first = rec.commit(1, seed)
    rec.evaluate(first, "dev", case_ids("dev")[:3], [half, one])
    second = rec.commit(2, first)
    rec.evaluate(second, "dev", case_ids("dev")[:3], [one, one, half])
    ledger.append(
        rec.run_id,
        "SafetyViolation",
        SafetyViolation(category="timeout", trial_id="req-3-syn-dev-000-0", detail=safety_detail),
        "server",
    )
    rec.evaluate(seed, "val", case_ids("val"), [Fraction(0), half])
    rec.evaluate(second, "val", case_ids("val"), [one, half, one])
    ledger.append(rec.run_id, "CandidateNominated", CandidateNominated(candidate=second), "server")
    test_scores = [one, one, half, one]
    rec.evaluate(second, "test", case_ids("test"), test_scores, k=2)
    per_case = []
    for i, case in enumerate(case_ids("test")):
        per_case.append(
            CaseScores(
                case_id=case, scores=[test_scores[(i + a) % len(test_scores)] for a in range(2)]
            )
        )
    e_plus = rules.expected_score({c.case_id: c.scores for c in per_case})
    ledger.append(
        rec.run_id,
        "RunScored",
        RunScored(
            candidate=second,
            k=2,
            per_case=per_case,
            e_h_plus=e_plus,
            e_h0=E_H0,
            g=rules.normalized_gain(e_plus, E_H0),
        ),
        "server",
    )
    if close:
        ledger.close_run(rec.run_id, reason="completed", summary={"nominated": second})
    return rec.run_id
