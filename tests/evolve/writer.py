"""Solve-evolve runs written event by event with the run's own key (the key holder), so a
test can tell one lie and see replay name it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from sample_terms import sha, task_terms

from holedger.ledger.store import Ledger
from holedger.protocol import evolve, rules
from holedger.replay.report import ReplayReport
from holedger.replay.runs import replay_run
from holedger.schemas.events import (
    CandidateCommitted,
    CaseScores,
    DisclosurePolicy,
    DisclosureProjected,
    EvaluationRequested,
    EvolveTerms,
    InSituScored,
    NoneRun,
    StepClosed,
    TokenUsage,
    TrialCompleted,
)

SEED, H1, H2, H3 = "a" * 40, "b" * 40, "c" * 40, "d" * 40
STREAM = [f"dev-{i}" for i in range(6)]
DEV_SIZE = 8


class EvolveWriter:
    def __init__(
        self,
        ledger: Ledger,
        *,
        batch: int = 2,
        steps: int = 3,
        optimizer: str = "evolver",
        none_run: NoneRun | None = None,
    ) -> None:
        self.ledger = ledger
        stream = STREAM[: batch * steps]
        self.terms = EvolveTerms(
            stream=stream,
            stream_digest=evolve.stream_digest("dev", stream),
            batch=batch,
            steps=steps,
            scope=["harness/prompts/"],
            none_run=none_run,
        )
        self.optimizer = optimizer
        terms = task_terms(sizes={"dev": DEV_SIZE, "val": 8, "test": 8}, seed_commit=SEED)
        self.run_id = ledger.open_run(
            terms, task_digest=sha("task"), optimizer=optimizer, solve_evolve=self.terms
        )
        self.used = rules.no_use()
        self.index = 0
        self.commit(SEED, None, ["harness/__main__.py", "harness/prompts/p.txt"])
        self.scores: dict[str, Fraction] = {}
        self.last: tuple[str, str] = ("", "")  # request id and projection digest

    def append(self, etype: str, payload: object) -> None:
        self.ledger.append(self.run_id, etype, payload, "server")  # type: ignore[arg-type]

    def commit(self, cand: str, parent: str | None, paths: Sequence[str]) -> None:
        self.append(
            "CandidateCommitted",
            CandidateCommitted(
                candidate=cand,
                index=self.index,
                tree=cand[:2] * 20,
                parent=parent,
                changed_paths=list(paths),
                immutable_ok=True,
            ),
        )
        self.index += 1

    def request(self, step: int, cand: str, cases: Sequence[str]) -> str:
        rid = f"step-{step:04d}"
        cost = rules.request_cost(DEV_SIZE, len(cases), 1)
        self.append(
            "EvaluationRequested",
            EvaluationRequested(
                request_id=rid,
                candidate=cand,
                split="dev",
                case_ids=list(cases),
                attempts=1,
                cost=cost,
                budget_before=self.used,
                decision="accepted",
            ),
        )
        self.used = rules.add_use(self.used, "dev", cost)
        self.trials: list[TrialCompleted] = []
        return rid

    def trial(self, rid: str, cand: str, case: str, score: int) -> None:
        trial = TrialCompleted(
            request_id=rid,
            trial_id=f"{rid}-{case}",
            candidate=cand,
            split="dev",
            case_id=case,
            attempt=0,
            backend="bwrap",
            isolation="isolated",
            limits={"wall_s": 60},
            exit_status=0,
            timed_out=False,
            oom=False,
            wall_ms=5,
            answer_digest=None,
            output_digest=None,
            trace_digest=None,
            score=Fraction(score),
            tokens=TokenUsage(),
            gateway_calls=0,
        )
        self.append("TrialCompleted", trial)
        self.trials.append(trial)
        self.scores[case] = Fraction(score)

    def project(self, rid: str) -> None:
        name, body = rules.project(
            "dev", DisclosurePolicy(), [rules.trial_view(t) for t in self.trials]
        )
        digest = rules.projection_digest(body)
        self.append(
            "DisclosureProjected",
            DisclosureProjected(
                request_id=rid, split="dev", policy=name, projection=body, projection_digest=digest
            ),
        )
        self.last = (rid, digest)

    def close_step(self, step: int, outcome: str, parent: str, cand: str) -> None:
        rid, digest = self.last
        self.append(
            "StepClosed",
            StepClosed(
                step=step,
                outcome=outcome,  # type: ignore[arg-type]
                parent=parent,
                candidate=cand,
                request_id=rid,
                projection_digest=digest,
                evolver_tokens=0,
            ),
        )

    def solve(self, step: int, cand: str, scores: Mapping[str, int]) -> str:
        """An honest step's request, trials and evidence; its request id."""
        rid = self.request(step, cand, list(scores))
        for case, score in scores.items():
            self.trial(rid, cand, case, score)
        self.project(rid)
        return rid

    def finish(self) -> None:
        per_case = [(c, [self.scores[c]]) for c in self.terms.stream if c in self.scores]
        j = evolve.in_situ(s for _, s in per_case)
        pinned = self.terms.none_run
        base = pinned.j if pinned else j if self.optimizer == evolve.NONE_OPTIMIZER else None
        self.append(
            "InSituScored",
            InSituScored(
                per_case=[CaseScores(case_id=c, scores=s) for c, s in per_case],
                j=j,
                base=base,
                delta=None if base is None else j - base,
            ),
        )
        self.ledger.close_run(self.run_id, "completed", {})

    def replay(self) -> ReplayReport:
        return replay_run(self.ledger, self.run_id)


def failed(report: ReplayReport) -> dict[str, str]:
    """Each failed check's detail, by name."""
    return {c.name: c.detail for c in report.checks if not c.ok and c.level == "error"}
