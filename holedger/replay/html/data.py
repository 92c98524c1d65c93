"""The page's data: a run's stored events folded leniently, in seq order (a damaged record
is skipped here, and the replay verdict at the top of the page names it)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from holedger.ledger.store import Ledger


@dataclass
class EvaluationRow:
    """One evaluation request and what its trials scored."""

    seq: int
    request_id: str
    candidate: str
    split: str
    cases: int
    attempts: int
    decision: str
    reason: str | None
    scores: list[Fraction] = field(default_factory=list)
    tokens: int = 0
    by_case: dict[str, list[Fraction]] = field(default_factory=dict)

    @property
    def mean(self) -> Fraction | None:
        """The mean over cases of each case's mean (the disclosed mean's definition)."""
        means = self.case_means
        return sum(means, Fraction(0)) / len(means) if means else None

    @property
    def case_means(self) -> list[Fraction]:
        return [sum(s, Fraction(0)) / len(s) for s in self.by_case.values() if s]


@dataclass
class TrialRow:
    seq: int
    trial_id: str
    candidate: str
    split: str
    case_id: str
    attempt: int
    request_id: str
    score: Fraction
    tokens: int
    wall_ms: int
    backend: str
    isolation: str


@dataclass
class CandidateRow:
    seq: int
    index: int
    commit: str
    parent: str | None
    changed: list[str]
    immutable_ok: bool


@dataclass
class RunData:
    """What the page needs from a run's events (read leniently, in seq order)."""

    run_id: str
    task_id: str = "?"
    optimizer: str = "?"
    opened_at: str = "?"
    closed_at: str | None = None
    terms: dict[str, Any] = field(default_factory=dict)
    seed_baseline: dict[str, Any] | None = None
    candidates: list[CandidateRow] = field(default_factory=list)
    evaluations: list[EvaluationRow] = field(default_factory=list)
    trials: list[TrialRow] = field(default_factory=list)
    gateway_calls: int = 0
    gateway_denied: int = 0
    safety: list[dict[str, Any]] = field(default_factory=list)
    nominated: str | None = None
    scored: dict[str, Any] | None = None
    closed_summary: dict[str, Any] | None = None
    unreadable: int = 0
    # the per-case held-out scores of the seed-baseline run E(H0) is pinned to, when that
    # run is in the same ledger (read from its RunScored)
    baseline_per_case: dict[str, list[Fraction]] | None = None

    def candidate_index(self, commit: str) -> str:
        for cand in self.candidates:
            if cand.commit == commit:
                return f"#{cand.index}"
        return commit[:8]


def as_fraction(value: Any) -> Fraction | None:
    if value is None:
        return None
    try:
        return Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        return None


def collect_run(ledger: Ledger, run_id: str) -> RunData:
    """Fold the stored events of ``run_id`` into the page's data (no verification here),
    with the per-case scores of its seed-baseline run when the ledger holds that run."""
    data = RunData(run_id)
    fold_records(run_id, _records(ledger, run_id, data), data)
    baseline_run = (data.seed_baseline or {}).get("baseline_run_id")
    if isinstance(baseline_run, str) and baseline_run != run_id:
        # a baseline run missing from this ledger has no records: replay's check says so
        baseline = fold_records(baseline_run, _records(ledger, baseline_run, None))
        if baseline.scored is not None:
            data.baseline_per_case = per_case_scores(baseline.scored)
    return data


def _records(ledger: Ledger, run_id: str, data: RunData | None) -> Iterator[dict[str, Any]]:
    records: list[tuple[int, dict[str, Any]]] = []
    for _, raw in ledger.raw_records(run_id):
        try:
            rec = json.loads(raw)
            records.append((int(rec["seq"]), rec))
        except (ValueError, KeyError, TypeError):
            if data is not None:
                data.unreadable += 1
    return (rec for _, rec in sorted(records, key=lambda r: r[0]))


def per_case_scores(scored: dict[str, Any]) -> dict[str, list[Fraction]]:
    """A RunScored payload's per-case scores, in attempt order."""
    out: dict[str, list[Fraction]] = {}
    for entry in scored.get("per_case") or []:
        scores = [as_fraction(s) for s in entry.get("scores", [])]
        out[str(entry.get("case_id"))] = [s for s in scores if s is not None]
    return out


def fold_records(
    run_id: str, records: Iterable[dict[str, Any]], data: RunData | None = None
) -> RunData:
    """Fold parsed record objects (envelope + payload) into a RunData."""
    data = data or RunData(run_id)
    by_request: dict[str, EvaluationRow] = {}
    for rec in records:
        try:
            _fold_one(data, by_request, rec)
        except (KeyError, TypeError, ValueError):
            data.unreadable += 1
    return data


def _fold_one(data: RunData, by_request: dict[str, EvaluationRow], rec: dict[str, Any]) -> None:
    etype = rec["type"]
    seq = int(rec["seq"])
    p: dict[str, Any] = rec.get("payload") or {}
    if etype == "RunOpened":
        data.task_id = str(p.get("task_id", "?"))
        data.optimizer = str(p.get("optimizer", "?"))
        data.opened_at = str(rec.get("time", "?"))
        data.terms = dict(p.get("terms") or {})
        data.seed_baseline = p.get("seed_baseline")
    elif etype == "CandidateCommitted":
        data.candidates.append(
            CandidateRow(
                seq,
                int(p["index"]),
                str(p["candidate"]),
                p.get("parent"),
                list(p.get("changed_paths") or []),
                bool(p.get("immutable_ok", True)),
            )
        )
    elif etype == "EvaluationRequested":
        row = EvaluationRow(
            seq,
            str(p["request_id"]),
            str(p["candidate"]),
            str(p["split"]),
            len(p.get("case_ids") or []),
            int(p.get("attempts", 1)),
            str(p.get("decision", "?")),
            p.get("reason"),
        )
        by_request[row.request_id] = row
        data.evaluations.append(row)
    elif etype == "TrialCompleted":
        tokens = int((p.get("tokens") or {}).get("total", 0))
        score = as_fraction(p.get("score")) or Fraction(0)
        trial = TrialRow(
            seq,
            str(p["trial_id"]),
            str(p["candidate"]),
            str(p["split"]),
            str(p["case_id"]),
            int(p.get("attempt", 0)),
            str(p.get("request_id", "")),
            score,
            tokens,
            int(p.get("wall_ms", 0)),
            str(p.get("backend", "?")),
            str(p.get("isolation", "?")),
        )
        data.trials.append(trial)
        request = by_request.get(str(p.get("request_id")))
        if request is not None:
            request.scores.append(score)
            request.by_case.setdefault(trial.case_id, []).append(score)
            request.tokens += tokens
    elif etype == "GatewayCall":
        data.gateway_calls += 1
        if not p.get("allowed", True):
            data.gateway_denied += 1
    elif etype == "SafetyViolation":
        data.safety.append({"seq": seq, **p})
    elif etype == "CandidateNominated":
        data.nominated = str(p["candidate"])
    elif etype == "RunScored":
        data.scored = dict(p)
    elif etype == "RunClosed":
        data.closed_at = str(rec.get("time", "?"))
        data.closed_summary = dict(p.get("summary") or {})
