"""The protocol-order projection: commit before evaluate, the sealed test split, one nomination.

Checks (each a named check in the report):

* ``candidates_committed``: every accepted request, trial and nomination names a
  candidate whose CandidateCommitted came earlier in the log;
* ``test_split_sealed``: no test-split request or trial before CandidateNominated, and
  after it only the nominated candidate's held-out scoring;
* ``nomination``: at most one CandidateNominated, no search request accepted after it,
  RunScored only after it (a run closed without a nomination is reported as unscored);
* ``trials_match_requests``: every trial belongs to an accepted request of the same
  candidate and split, its (case, attempt) is one of the request's case ids x attempts
  (attempts numbered from 0), none twice, none after the request's projection, and every
  accepted request got all of its trials. Held-out scoring may be recorded with or
  without an EvaluationRequested on the test split; without one, its trials are checked
  by the scores projection (K attempts per test case).

An **aborted** run (``RunClosed.reason`` = ``aborted``, as ``holedger run abort`` writes
it) may end with its held-out scoring cut short: the held-out request then lacks trials
and the run has no RunScored, which is reported, not failed. Every search request must
still have all its trials (``run abort`` records those left without, as not run). The
section ``closed`` holds the reason and the operator's stated why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from holedger.ledger.records import Record
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    DisclosureProjected,
    EvaluationRequested,
    Model,
    RunClosed,
    RunScored,
    TrialCompleted,
)

ABORTED = "aborted"  # RunClosed.reason of a run closed without finishing (run abort)
COMMITTED = "candidates_committed"
SEALED = "test_split_sealed"
NOMINATION = "nomination"
TRIALS = "trials_match_requests"
# More trials than one request of any run may ask for (the server refuses attempts over
# 10,000 and a split's cases are far fewer than 100): an accepted request past it is
# refused here, not listed pair by pair.
MAX_REQUEST_TRIALS = 1_000_000

CHECKS = (
    (COMMITTED, "every evaluated or nominated candidate was committed before"),
    (SEALED, "no test-split trial before nomination; after it only held-out scoring"),
    (NOMINATION, "exactly one nomination, then scoring"),
    (TRIALS, "trials belong to accepted requests and match their case ids x attempts"),
)


@dataclass
class _Request:
    seq: int
    candidate: str
    split: str
    accepted: bool
    expected: set[tuple[str, int]]
    seen: set[tuple[str, int]] = field(default_factory=set)
    projected: bool = False


class OrderFold:
    name = "protocol"

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.committed: set[str] = set()
        self.requests: dict[str, _Request] = {}
        self.nominated: str | None = None
        self.nominations = 0
        self.scored = 0
        self.heldout_seen: set[tuple[str, int]] = set()
        self.failures: list[tuple[int | None, str, str, str]] = []
        self.trials = 0
        self.closed: RunClosed | None = None

    def _fail(self, seq: int | None, etype: str, reason: str, check: str) -> None:
        self.failures.append((seq, etype, reason, check))

    def apply(self, rec: Record, payload: Model) -> None:
        seq = rec.seq
        if isinstance(payload, CandidateCommitted):
            self.committed.add(payload.candidate)
        elif isinstance(payload, EvaluationRequested):
            self._request(seq, payload)
        elif isinstance(payload, TrialCompleted):
            self._trial(seq, payload)
        elif isinstance(payload, DisclosureProjected):
            req = self.requests.get(payload.request_id)
            if req is not None:
                req.projected = True
        elif isinstance(payload, CandidateNominated):
            self.nominations += 1
            if payload.candidate not in self.committed:
                self._fail(
                    seq,
                    rec.type,
                    f"nominated candidate {payload.candidate[:12]} was never committed",
                    COMMITTED,
                )
            if self.nominations > 1:
                self._fail(seq, rec.type, "a second nomination", NOMINATION)
            else:
                self.nominated = payload.candidate
        elif isinstance(payload, RunClosed):
            self.closed = payload
        elif isinstance(payload, RunScored):
            self.scored += 1
            if self.nominated is None:
                self._fail(seq, rec.type, "RunScored without a nomination", NOMINATION)
            if self.scored > 1:
                self._fail(seq, rec.type, "a second RunScored", NOMINATION)

    def _request(self, seq: int, req: EvaluationRequested) -> None:
        etype = "EvaluationRequested"
        if req.request_id in self.requests:
            self._fail(seq, etype, f"request id {req.request_id} used twice", TRIALS)
            return
        accepted = req.decision == "accepted"
        # Only an accepted request has trials to match; a rejected one may name any number
        # of attempts (it costs nothing), so its pairs are never listed.
        expected: set[tuple[str, int]] = set()
        if accepted and len(req.case_ids) * req.attempts > MAX_REQUEST_TRIALS:
            self._fail(
                seq,
                etype,
                f"accepted request {req.request_id} asks for "
                f"{len(req.case_ids) * req.attempts} trials, more than any run may hold "
                f"({MAX_REQUEST_TRIALS})",
                TRIALS,
            )
        elif accepted:
            expected = {(c, a) for c in req.case_ids for a in range(req.attempts)}
        self.requests[req.request_id] = _Request(seq, req.candidate, req.split, accepted, expected)
        if not accepted:
            return
        if req.candidate not in self.committed:
            self._fail(
                seq,
                etype,
                f"request {req.request_id} evaluates candidate {req.candidate[:12]}, "
                "which was never committed",
                COMMITTED,
            )
        if req.split == "test":
            if self.nominated is None:
                self._fail(
                    seq, etype, f"test-split request {req.request_id} before nomination", SEALED
                )
            elif req.candidate != self.nominated:
                self._fail(
                    seq,
                    etype,
                    f"test-split request {req.request_id} for candidate {req.candidate[:12]}, "
                    "not the nominated one",
                    SEALED,
                )
        elif self.nominated is not None:
            self._fail(
                seq,
                etype,
                f"{req.split} request {req.request_id} accepted after the nomination",
                NOMINATION,
            )

    def _trial(self, seq: int, trial: TrialCompleted) -> None:
        etype = "TrialCompleted"
        self.trials += 1
        key = (trial.case_id, trial.attempt)
        label = f"trial {trial.trial_id} ({trial.case_id}#{trial.attempt})"
        if trial.candidate not in self.committed:
            self._fail(
                seq,
                etype,
                f"{label} runs candidate {trial.candidate[:12]}, never committed",
                COMMITTED,
            )
        if trial.split == "test":
            if self.nominated is None:
                self._fail(seq, etype, f"test-split {label} before nomination", SEALED)
            elif trial.candidate != self.nominated:
                self._fail(
                    seq,
                    etype,
                    f"test-split {label} of a candidate that was not nominated",
                    SEALED,
                )
            elif self.scored:
                self._fail(seq, etype, f"test-split {label} after RunScored", SEALED)
        req = self.requests.get(trial.request_id)
        if req is None:
            if trial.split == "test" and self.nominated is not None:
                if key in self.heldout_seen:
                    self._fail(seq, etype, f"held-out {label} recorded twice", TRIALS)
                self.heldout_seen.add(key)
                return
            self._fail(seq, etype, f"{label} belongs to no request {trial.request_id}", TRIALS)
            return
        if not req.accepted:
            self._fail(seq, etype, f"{label} of rejected request {trial.request_id}", TRIALS)
            return
        if trial.candidate != req.candidate or trial.split != req.split:
            self._fail(
                seq,
                etype,
                f"{label} is of {trial.candidate[:12]}/{trial.split}, its request "
                f"{trial.request_id} of {req.candidate[:12]}/{req.split}",
                TRIALS,
            )
        if key not in req.expected:
            self._fail(
                seq,
                etype,
                f"{label} is not among request {trial.request_id}'s case ids x attempts",
                TRIALS,
            )
        elif key in req.seen:
            self._fail(seq, etype, f"{label} recorded twice", TRIALS)
        if req.projected:
            self._fail(seq, etype, f"{label} after its request's projection", TRIALS)
        req.seen.add(key)

    def finish(self, out: ReportBuilder) -> None:
        for name, detail in CHECKS:
            out.declare(name, detail)
        past_break = 0  # requests whose missing trials may lie past a break in the log
        cut_short = 0  # held-out requests of an aborted run, left without (all) trials
        aborted = self.closed is not None and self.closed.reason == ABORTED
        if self.closed is not None:
            why = self.closed.summary.get("why")
            out.section(
                "closed",
                {"reason": self.closed.reason, "why": why if isinstance(why, str) else None},
            )
        for request_id, req in self.requests.items():
            missing = len(req.expected - req.seen)
            if req.accepted and missing and self.ctx.cut_after is not None:
                past_break += 1
            elif req.accepted and missing and aborted and req.split == "test" and not self.scored:
                cut_short += 1
            elif req.accepted and missing:
                self._fail(
                    req.seq,
                    "EvaluationRequested",
                    f"request {request_id}: {missing} of {len(req.expected)} trials never recorded",
                    TRIALS,
                )
        for seq, etype, reason, check in self.failures:
            out.fail(seq, etype, reason, check=check)
        failed = {check for *_, check in self.failures}
        if NOMINATION not in failed:
            if self.nominations == 0:
                out.check(NOMINATION, True, "no nomination in the log: the run is unscored")
            else:
                out.check(NOMINATION, True, f"one nomination ({(self.nominated or '')[:12]})")
        if TRIALS not in failed:
            accepted = sum(r.accepted for r in self.requests.values())
            out.check(
                TRIALS,
                True,
                f"{self.trials} trials match the case ids x attempts of {accepted} "
                "accepted requests"
                + (
                    f"; {counted(past_break, 'request')} {'lacks' if past_break == 1 else 'lack'} "
                    "trials, which may lie past the "
                    "break: not judged"
                    if past_break
                    else ""
                )
                + (
                    "; the held-out scoring was cut short by the abort (not judged)"
                    if cut_short
                    else ""
                ),
            )
