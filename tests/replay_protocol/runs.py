"""Hand-written runs for replay tests: a tiny task and a writer that speaks the protocol.

The writer appends events with the low-level ledger API (``Ledger.append``), deciding
honestly with ``holedger.protocol.rules`` unless a test overrides a field, which is how a
dishonest server is simulated: every event is still validly signed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pygit2
from sample_terms import task_terms

from holedger.errors import PolicyError
from holedger.ledger.store import Ledger
from holedger.protocol import rules
from holedger.replay.inputs import CaseData, TaskData
from holedger.replay.report import ReplayReport
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    CaseScores,
    DisclosurePolicy,
    DisclosureProjected,
    EvaluationRequested,
    OptimizerDescriptor,
    RescoreOf,
    RunScored,
    SeedBaseline,
    TaskTerms,
    TokenUsage,
    TrialCompleted,
)

TASK_DIGEST = hashlib.sha256(b"replay-protocol test task").hexdigest()
ZERO = "0" * 64
K = 2
E_H0 = Fraction(1, 3)

# test answers are four-digit numbers; the seed corpus holds two of them (as task data
# would), which must not count against a candidate
DEV = [
    CaseData(
        f"rp-dev-{i}",
        {"question": f"dev question number {i} about widgets"},
        {"kind": "lookup", "value": str(100 + i)},
    )
    for i in range(4)
]
VAL = [
    CaseData(
        f"rp-val-{i}",
        {"question": f"validation question {i} about gadgets"},
        {"kind": "lookup", "value": str(200 + i)},
    )
    for i in range(6)
]
TEST = [
    CaseData(
        f"rp-test-{i}",
        {"question": f"held-out question {i}: the sprocket count"},
        {"kind": "lookup", "value": str(7301 + 17 * i)},
    )
    for i in range(4)
]


def task_data(digest: str = TASK_DIGEST) -> TaskData:
    return TaskData("rp-task", digest, {"dev": list(DEV), "val": list(VAL), "test": list(TEST)})


def terms(seed_commit: str = "seed", **budget: Any) -> TaskTerms:
    return task_terms(
        "rp-task",
        models=["holedger-sim-1"],
        sizes={"dev": len(DEV), "val": len(VAL), "test": len(TEST)},
        calls=(budget.get("dev_calls", 4), budget.get("val_calls", 2)),
        case_passes=(3, 2),
        target_tokens=1000,
        digest=ZERO,
        disclosure=DisclosurePolicy(min_aggregate_cases=5),
        k=K,
        seed_commit=seed_commit,
        entrypoint=["python3", "-m", "harness"],
        immutable_paths=["corpus"],
        case_timeout_s=30,
    )


def score_of(candidate: str, case_id: str, attempt: int) -> Fraction:
    """A deterministic score in {0, 1/2, 1} for a candidate's attempt on a case."""
    digest = hashlib.sha256(f"{candidate}/{case_id}/{attempt}".encode()).digest()
    return Fraction(digest[0] % 3, 2)


def answer_of(case_id: str, attempt: int) -> Any:
    return {"answer": f"{case_id}-{attempt}".replace("rp-", "ans-")}


class RunWriter:
    """Writes one run event by event; ``honest`` decisions come from the rules."""

    def __init__(
        self,
        ledger: Ledger,
        run_terms: TaskTerms,
        *,
        task_digest: str = TASK_DIGEST,
        optimizer: str = "test",
        descriptor: OptimizerDescriptor | None = None,
        rescore_of: RescoreOf | None = None,
    ) -> None:
        self.ledger = ledger
        self.terms = run_terms
        self.run_id = ledger.open_run(
            run_terms,
            task_digest=task_digest,
            optimizer=optimizer,
            seed_baseline=SeedBaseline(e_h0=E_H0, k=K),
            descriptor=descriptor,
            rescore_of=rescore_of,
        )
        self.used = rules.no_use()
        self.nominated = False
        self.count = 0
        self.trials: dict[str, list[TrialCompleted]] = {}
        # Answers that differ from answer_of, by (case id, attempt).
        self.answers: dict[tuple[str, int], Any] = {}

    def answer(self, case_id: str, attempt: int) -> Any:
        return self.answers.get((case_id, attempt), answer_of(case_id, attempt))

    def append(self, event_type: str, payload: Any, role: str = "server") -> int:
        return self.ledger.append(self.run_id, event_type, payload, role=role).seq  # type: ignore[arg-type]

    def commit(self, candidate: str, tree: str = "t" * 40, index: int | None = None) -> int:
        payload = CandidateCommitted(
            candidate=candidate,
            index=self.count if index is None else index,
            tree=tree,
            parent=None,
            changed_paths=[],
            immutable_ok=True,
        )
        self.count += 1
        return self.append("CandidateCommitted", payload)

    def request(
        self,
        candidate: str,
        split: str,
        case_ids: Sequence[str],
        attempts: int = 1,
        **override: Any,
    ) -> tuple[str, int]:
        request_id = f"req-{len(self.trials) + 1}"
        cost = rules.request_cost(self.terms.split_sizes[split], len(case_ids), attempts)  # type: ignore[index]
        refusal = rules.request_problem(
            self.terms, split, list(case_ids), attempts, nominated=self.nominated, known_cases=None
        ) or rules.budget_decision(self.terms.budget, self.used, split, cost)
        fields: dict[str, Any] = {
            "request_id": request_id,
            "candidate": candidate,
            "split": split,
            "case_ids": list(case_ids),
            "attempts": attempts,
            "cost": cost,
            "budget_before": self.used,
            "decision": "accepted" if refusal is None else "rejected",
            "reason": None if refusal is None else refusal.text,
            "code": None if refusal is None else refusal.code,
        }
        fields.update(override)
        seq = self.append("EvaluationRequested", EvaluationRequested(**fields))
        if fields["decision"] == "accepted":
            self.used = rules.add_use(self.used, split, cost)
        self.trials[request_id] = []
        return request_id, seq

    def trial(
        self, request_id: str, candidate: str, split: str, case_id: str, attempt: int, **over: Any
    ) -> int:
        answer = self.answer(case_id, attempt)
        digest = self.ledger.put_blob(rules.answer_bytes(answer))
        fields: dict[str, Any] = {
            "request_id": request_id,
            "trial_id": f"{request_id}/{case_id}/{attempt}",
            "candidate": candidate,
            "split": split,
            "case_id": case_id,
            "attempt": attempt,
            "backend": "bwrap",
            "isolation": "isolated",
            "limits": {"wall_s": 30},
            "exit_status": 0,
            "timed_out": False,
            "oom": False,
            "wall_ms": 5,
            "answer_digest": digest,
            "output_digest": None,
            "trace_digest": None,
            "score": score_of(candidate, case_id, attempt),
            "tokens": TokenUsage(),
            "gateway_calls": 0,
        }
        fields.update(over)
        payload = TrialCompleted(**fields)
        self.trials.setdefault(request_id, []).append(payload)
        return self.append("TrialCompleted", payload)

    def run_trials(
        self, request_id: str, candidate: str, split: str, case_ids: Sequence[str], attempts: int
    ) -> None:
        for case_id in case_ids:
            for attempt in range(attempts):
                self.trial(request_id, candidate, split, case_id, attempt)

    def project(
        self,
        request_id: str,
        split: str,
        edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        policy: str | None = None,
    ) -> int:
        views = [
            rules.trial_view(t, self.answer(t.case_id, t.attempt)) for t in self.trials[request_id]
        ]
        try:
            name, body = rules.project(split, self.terms.disclosure, views)
        except PolicyError:  # a dishonest server projects anyway
            name, body = "aggregate", {}
        if edit is not None:
            body = edit(body)
        payload = DisclosureProjected(
            request_id=request_id,
            split=split,  # type: ignore[arg-type]
            policy=policy or name,  # type: ignore[arg-type]
            projection=body,
            projection_digest=rules.projection_digest(body),
        )
        return self.append("DisclosureProjected", payload)

    def evaluate(
        self, candidate: str, split: str, case_ids: Sequence[str], attempts: int = 1
    ) -> str:
        request_id, _ = self.request(candidate, split, case_ids, attempts)
        self.run_trials(request_id, candidate, split, case_ids, attempts)
        self.project(request_id, split)
        return request_id

    def nominate(self, candidate: str) -> int:
        self.nominated = True
        return self.append("CandidateNominated", CandidateNominated(candidate=candidate))

    def heldout(self, candidate: str) -> str:
        ids = [c.id for c in TEST]
        request_id, _ = self.request(candidate, "test", ids, K)
        self.run_trials(request_id, candidate, "test", ids, K)
        return request_id

    def scored(self, candidate: str, **override: Any) -> int:
        per_case = {c.id: [score_of(candidate, c.id, a) for a in range(K)] for c in TEST}
        e_plus = rules.expected_score(per_case)
        fields: dict[str, Any] = {
            "candidate": candidate,
            "k": K,
            "per_case": [CaseScores(case_id=c, scores=s) for c, s in per_case.items()],
            "e_h_plus": e_plus,
            "e_h0": E_H0,
            "g": rules.normalized_gain(e_plus, E_H0),
        }
        fields.update(override)
        return self.append("RunScored", RunScored(**fields))

    def close(self) -> None:
        self.ledger.close_run(self.run_id)


def honest_search(writer: RunWriter, seed: str, candidate: str) -> None:
    """Commits, a dev and a val evaluation, one rejected request: the search phase."""
    writer.commit(seed)
    writer.commit(candidate)
    writer.evaluate(seed, "dev", [c.id for c in DEV[:2]], 2)
    writer.evaluate(candidate, "dev", [c.id for c in DEV], 1)
    writer.evaluate(candidate, "val", [c.id for c in VAL[:5]], 1)
    writer.request(candidate, "val", [c.id for c in VAL[:2]], 1)  # below min cases: rejected


def honest_finish(writer: RunWriter, candidate: str) -> None:
    writer.nominate(candidate)
    writer.heldout(candidate)
    writer.scored(candidate)
    writer.close()


def failures_of(report: ReplayReport, check: str) -> list[str]:
    return [f"{f.seq}:{f.type}:{f.reason}" for f in report.failures if f.check == check]


def checks(report: ReplayReport) -> dict[str, bool]:
    """The checks of the verdict (warnings, such as keys_pinned, are left out)."""
    return {c.name: c.ok for c in report.checks if c.level == "error"}


# --------------------------------------------------------------------------- a candidate repo


def _tree(repo: pygit2.Repository, files: dict[str, str]) -> pygit2.Oid:
    nested: dict[str, Any] = {}
    for path, text in files.items():
        parts = path.split("/")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = text

    def build(node: dict[str, Any]) -> pygit2.Oid:
        builder = repo.TreeBuilder()
        for name, value in sorted(node.items()):
            if isinstance(value, dict):
                builder.insert(name, build(value), pygit2.enums.FileMode.TREE)
            else:
                blob = repo.create_blob(value.encode())
                builder.insert(name, blob, pygit2.enums.FileMode.BLOB)
        return builder.write()

    return build(nested)


def commit_files(
    repo: pygit2.Repository, files: dict[str, str], parent: str | None = None
) -> tuple[str, str]:
    """Commit ``files`` (path -> text) into the bare ``repo``; return (commit id, tree id)."""
    tree = _tree(repo, files)
    sig = pygit2.Signature("holedger", "holedger@localhost", 0, 0)
    parents = [pygit2.Oid(hex=parent)] if parent else []
    oid = repo.create_commit(None, sig, sig, "candidate", tree, parents)
    return str(oid), str(tree)


SEED_FILES = {
    "harness/__main__.py": (
        "import json, sys\n"
        "case = json.load(sys.stdin)\n"
        "print(json.dumps({'answer': str(len(case['question']))}))\n"
    ),
    # the task's own data holds two test answers: not evidence against anyone
    "corpus/sprockets.txt": f"sprockets 2022: {TEST[0].expected['value']}\n"
    f"sprockets 2023: {TEST[1].expected['value']}\n",
}


def new_repo(path: Path) -> pygit2.Repository:
    return pygit2.init_repository(str(path), bare=True)
