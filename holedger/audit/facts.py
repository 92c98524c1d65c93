"""What an audit reads of a run's log (the audited run or a control run): its trials,
candidates, nominee, scores, projections and checkpoints, as plain facts.

Pure functions of the records; the audit and its verification read the same facts the
same way, so every number replay recomputes comes from here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from holedger.audit.detectors import TrialFacts
from holedger.ledger.merkle import MerkleFrontier
from holedger.ledger.records import Record
from holedger.protocol.runs import control_scores_digest


class RunStore(Protocol):
    """Where an audit reads runs and blobs: the ledger, or an audits bundle."""

    def has_run(self, run_id: str) -> bool: ...

    def records(self, run_id: str, after_seq: int = -1) -> Iterator[Record]: ...

    def get_blob(self, digest: str) -> bytes: ...


@dataclass(frozen=True)
class Trial:
    trial_id: str
    request_id: str
    candidate: str
    split: str
    case_id: str
    attempt: int
    score: Fraction
    gateway_calls: int
    tokens: int
    answer_digest: str | None


@dataclass
class RunFacts:
    run_id: str
    seed_commit: str = ""
    task_digest: str = ""
    optimizer: str = ""
    control_of: dict[str, Any] | None = None  # a control run's binding (RunOpened.control_of)
    server_key: dict[str, Any] = field(default_factory=dict)
    parents: dict[str, str | None] = field(default_factory=dict)
    trees: dict[str, str] = field(default_factory=dict)  # candidate -> git tree id
    trials: list[Trial] = field(default_factory=list)
    responses: dict[str, list[str]] = field(default_factory=dict)  # trial id -> digests
    requests: set[str] = field(default_factory=set)
    projected: set[str] = field(default_factory=set)
    nominee: str | None = None
    held_out: tuple[Fraction, Fraction] | None = None  # (E(H+), E(H0))
    closed: bool = False
    closed_seq: int | None = None
    checkpoints: dict[int, str] = field(default_factory=dict)  # size -> root hex
    leaves: list[bytes] = field(default_factory=list)
    # seq -> payload of each AuditControlEvaluated, the server's record of a control
    # evaluation made for an audit (after RunClosed, in a sound log)
    controls: dict[int, dict[str, Any]] = field(default_factory=dict)
    held_out_cases: dict[str, list[Fraction]] = field(default_factory=dict)  # RunScored
    baseline_run: str | None = None  # the pinned seed-baseline run

    def search_trials(self, candidate: str) -> list[Trial]:
        return [t for t in self.trials if t.candidate == candidate and t.split in ("dev", "val")]

    def root_at(self, size: int) -> str | None:
        """The Merkle root of the first ``size`` records, or None beyond the log."""
        if size < 1 or size > len(self.leaves):
            return None
        frontier = MerkleFrontier()
        for leaf in self.leaves[:size]:
            frontier.append(leaf)
        return frontier.root().hex()


def read_run(run_id: str, records: Iterable[Record]) -> RunFacts:
    facts = RunFacts(run_id)
    for rec in records:
        facts.leaves.append(rec.leaf_hash)
        p = rec.payload
        if rec.type == "RunOpened":
            facts.seed_commit = str(p["terms"]["seed_commit"])
            facts.task_digest = str(p.get("task_digest", ""))
            facts.optimizer = str(p.get("optimizer", ""))
            facts.control_of = p.get("control_of")
            facts.server_key = dict(p["keys"]["server"])
            facts.baseline_run = (p.get("seed_baseline") or {}).get("baseline_run_id")
        elif rec.type == "CandidateCommitted":
            facts.parents[str(p["candidate"])] = p.get("parent")
            facts.trees[str(p["candidate"])] = str(p.get("tree", ""))
        elif rec.type == "EvaluationRequested":
            facts.requests.add(str(p["request_id"]))
        elif rec.type == "DisclosureProjected":
            facts.projected.add(str(p["request_id"]))
        elif rec.type == "TrialCompleted":
            facts.trials.append(
                Trial(
                    trial_id=str(p["trial_id"]),
                    request_id=str(p["request_id"]),
                    candidate=str(p["candidate"]),
                    split=str(p["split"]),
                    case_id=str(p["case_id"]),
                    attempt=int(p["attempt"]),
                    score=Fraction(str(p["score"])),
                    gateway_calls=int(p.get("gateway_calls", 0)),
                    tokens=int((p.get("tokens") or {}).get("total", 0)),
                    answer_digest=p.get("answer_digest"),
                )
            )
        elif rec.type == "GatewayCall" and p.get("trial_id") and p.get("response_digest"):
            facts.responses.setdefault(str(p["trial_id"]), []).append(str(p["response_digest"]))
        elif rec.type == "CandidateNominated":
            facts.nominee = str(p["candidate"])
        elif rec.type == "RunScored":
            e_plus = p.get("e_h_plus", p.get("e_hplus"))
            e_zero = p.get("e_h0")
            if e_plus is not None and e_zero is not None:
                facts.held_out = (Fraction(str(e_plus)), Fraction(str(e_zero)))
            facts.held_out_cases = {
                str(row["case_id"]): [Fraction(str(v)) for v in row["scores"]]
                for row in p.get("per_case", [])
            }
        elif rec.type == "RunClosed":
            facts.closed = True
            facts.closed_seq = rec.seq
        elif rec.type == "Checkpoint":
            facts.checkpoints[int(p["size"])] = str(p["root"])
        elif rec.type == "AuditControlEvaluated":
            facts.controls[rec.seq] = dict(p)
    return facts


def per_case(trials: Sequence[Trial]) -> dict[str, list[Fraction]]:
    """Scores per case, in attempt order."""
    out: dict[str, list[Trial]] = {}
    for t in trials:
        out.setdefault(t.case_id, []).append(t)
    return {c: [t.score for t in sorted(ts, key=lambda t: t.attempt)] for c, ts in out.items()}


def mean_per_case(trials: Sequence[Trial], attr: str) -> Fraction:
    """The mean over cases of each case's mean ``attr`` (gateway calls or tokens)."""
    by_case: dict[str, list[int]] = {}
    for t in trials:
        by_case.setdefault(t.case_id, []).append(int(getattr(t, attr)))
    if not by_case:
        return Fraction(0)
    means = [Fraction(sum(v), len(v)) for v in by_case.values()]
    return sum(means, Fraction(0)) / len(means)


def scores_digest(trials: Sequence[Trial]) -> str:
    """What ControlEvaluated pins: SHA-256 of the canonical [case, attempt, score] list."""
    return control_scores_digest((t.case_id, t.attempt, t.score) for t in trials)


def answer_of(blob: bytes | None) -> Any | None:
    if blob is None:
        return None
    try:
        return json.loads(blob)
    except ValueError:
        return None


def response_text(blob: bytes) -> str:
    """The model's words in a stored response body (chat completion JSON or an SSE
    stream), else the body as text."""
    text = blob.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text
    parts: list[str] = []
    for choice in body.get("choices", []) if isinstance(body, dict) else []:
        message = choice.get("message") or {}
        if isinstance(message.get("content"), str):
            parts.append(message["content"])
        for call in message.get("tool_calls") or []:
            parts.append(str((call.get("function") or {}).get("arguments", "")))
    return "\n".join(parts) if parts else text


def trial_facts(
    trials: Sequence[Trial],
    answers: Mapping[str, Any | None],
    responses: Mapping[str, Sequence[str]],
) -> list[TrialFacts]:
    """Trials as the detectors see them (answers and response texts looked up)."""
    return [
        TrialFacts(
            t.trial_id,
            t.candidate,
            t.case_id,
            t.attempt,
            t.gateway_calls,
            answers.get(t.trial_id),
            t.score,
            tuple(responses.get(t.trial_id, ())),
        )
        for t in trials
    ]
