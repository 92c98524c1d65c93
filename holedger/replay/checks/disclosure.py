"""The disclosure projection: each DisclosureProjected obeys the policy and equals its trials.

For every projection replay checks that it answers an accepted search request, once and
after all of that request's trials; that its policy is the split's (dev ``per_case``,
val ``aggregate`` over at least ``min_aggregate_cases`` cases, test never); that its
digest is the digest of its body; and that ``rules.project`` over the request's recorded
trials gives the very same body. Answers are read from the answer blobs (canonical JSON,
``rules.answer_bytes``); when a blob is redacted the projection's own answer is used if it
hashes to the trial's answer digest, and otherwise the answer is taken as unknown, which
the rules show by digest (``answer_in_blob``): a projection that withheld such an answer
agrees, since withholding shows less, never more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from holedger.errors import CanonicalError, PolicyError
from holedger.ledger.records import Record
from holedger.protocol import rules
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.schemas.canonical import canonical_json, parse_json
from holedger.schemas.events import (
    DisclosureProjected,
    EvaluationRequested,
    Model,
    TrialCompleted,
)

CHECK = "disclosure"
AGGREGATE_FIELDS = {"cases", "trials", "mean"}


@dataclass
class _Request:
    seq: int
    split: str
    accepted: bool
    expected: int
    trials: list[TrialCompleted] = field(default_factory=list)
    projections: int = 0


class DisclosureFold:
    name = "disclosure"

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.policy = ctx.opened.terms.disclosure
        self.requests: dict[str, _Request] = {}
        self.failures: list[tuple[int, str, str]] = []
        self.checked = 0

    def _fail(self, seq: int, etype: str, reason: str) -> None:
        self.failures.append((seq, etype, reason))

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, EvaluationRequested):
            self.requests.setdefault(
                payload.request_id,
                _Request(
                    rec.seq,
                    payload.split,
                    payload.decision == "accepted",
                    len(payload.case_ids) * payload.attempts,
                ),
            )
        elif isinstance(payload, TrialCompleted):
            req = self.requests.get(payload.request_id)
            if req is not None and req.projections == 0 and req.split != "test":
                req.trials.append(payload)
        elif isinstance(payload, DisclosureProjected):
            self._projection(rec.seq, payload)

    def _projection(self, seq: int, proj: DisclosureProjected) -> None:
        etype = "DisclosureProjected"
        rid = proj.request_id
        if proj.split == "test" or proj.policy == "none":
            self._fail(seq, etype, f"projection of request {rid} discloses the test split")
            return
        req = self.requests.get(rid)
        if req is None or not req.accepted:
            state = "unknown" if req is None else "rejected"
            self._fail(seq, etype, f"projection of {state} request {rid}")
            return
        req.projections += 1
        if req.projections > 1:
            self._fail(seq, etype, f"a second projection of request {rid}")
            return
        if proj.split != req.split:
            self._fail(seq, etype, f"projection of {rid} says {proj.split}, request {req.split}")
            return
        expected_policy = getattr(self.policy, proj.split)
        if proj.policy != expected_policy:
            self._fail(
                seq,
                etype,
                f"{proj.split} projection of {rid} uses policy {proj.policy}; "
                f"the {proj.split} policy is {expected_policy} only",
            )
            return
        if proj.split == "val" and not self._aggregate_only(seq, rid, proj.projection):
            return
        if rules.projection_digest(proj.projection) != proj.projection_digest:
            self._fail(seq, etype, f"projection digest of {rid} is not its body's digest")
        if len(req.trials) < req.expected:
            self._fail(
                seq,
                etype,
                f"projection of {rid} after {len(req.trials)} of {req.expected} trials",
            )
            return
        self._compare(seq, rid, proj, req)
        req.trials = []  # checked: memory stays bounded by the requests in flight

    def _aggregate_only(self, seq: int, rid: str, body: dict[str, Any]) -> bool:
        etype = "DisclosureProjected"
        extra = sorted(set(body) - AGGREGATE_FIELDS)
        if extra or set(body) != AGGREGATE_FIELDS:
            self._fail(
                seq,
                etype,
                f"val projection of {rid} is not aggregate-only: fields {sorted(body)} "
                f"(allowed: cases, trials, mean)",
            )
            return False
        cases = body["cases"]
        if not isinstance(cases, int) or isinstance(cases, bool):
            self._fail(seq, etype, f"val projection of {rid}: cases is not a count")
            return False
        if cases < self.policy.min_aggregate_cases:
            self._fail(
                seq,
                etype,
                f"val projection of {rid} aggregates {cases} cases, below the minimum "
                f"{self.policy.min_aggregate_cases}",
            )
            return False
        return True

    def _compare(self, seq: int, rid: str, proj: DisclosureProjected, req: _Request) -> None:
        etype = "DisclosureProjected"
        shown = _shown_answers(proj.projection)
        views = []
        for trial in req.trials:
            answer, known = self._answer(trial, shown)
            views.append(rules.trial_view(trial, answer, answer_known=known))
        try:
            _, body = rules.project(req.split, self.policy, views)
        except PolicyError as exc:
            self._fail(seq, etype, f"projection of {rid}: the rules refuse it: {exc.message}")
            return
        self.checked += 1
        if canonical_json(body) == _canonical(proj.projection):
            return
        self._fail(seq, etype, f"projection of {rid} {_difference(proj.projection, body)}")

    def _answer(self, trial: TrialCompleted, shown: dict[tuple[str, int], Any]) -> tuple[Any, bool]:
        """The trial's answer and whether it is known (see ``rules.TrialView``)."""
        if trial.answer_digest is None:
            return None, True
        data = self.ctx.blobs.blob(trial.answer_digest)
        if data is None:  # redacted: the shown answer stands if it has the recorded digest
            key = (trial.case_id, trial.attempt)
            if key in shown:
                try:
                    if rules.answer_digest(shown[key]) == trial.answer_digest:
                        return shown[key], True
                except CanonicalError:
                    pass
            # Unknown: re-derived as shown by digest. A projection that showed it by
            # digest agrees (withholding shows less, never more); one that showed other
            # bytes does not.
            return None, False
        try:
            return parse_json(data), True
        except CanonicalError:
            return data.decode("utf-8", errors="replace"), True

    def finish(self, out: ReportBuilder) -> None:
        out.declare(CHECK, "every projection obeys the policy and equals its recorded trials")
        past_break = 0  # unprojected requests whose projection may lie past a break
        for rid, req in self.requests.items():
            if req.accepted and req.split != "test" and req.projections == 0:
                if self.ctx.cut_after is not None:
                    past_break += 1
                    continue
                self._fail(
                    req.seq, "EvaluationRequested", f"accepted request {rid} has no projection"
                )
        for seq, etype, reason in self.failures:
            out.fail(seq, etype, reason, check=CHECK)
        if not self.failures:
            out.check(
                CHECK,
                True,
                f"{counted(self.checked, 'projection')} checked: each obeys the policy and equals "
                "what its trials imply"
                + (
                    f"; {counted(past_break, 'request')} without one, which may lie past the "
                    "break: not judged"
                    if past_break
                    else ""
                ),
            )


def _canonical(value: Any) -> bytes:
    try:
        return canonical_json(value)
    except CanonicalError:
        return b""


def _shown_answers(body: dict[str, Any]) -> dict[tuple[str, int], Any]:
    shown: dict[tuple[str, int], Any] = {}
    cases = body.get("cases")
    if not isinstance(cases, dict):
        return shown
    for case_id, entry in cases.items():
        trials = entry.get("trials") if isinstance(entry, dict) else None
        for trial in trials if isinstance(trials, list) else []:
            if (
                isinstance(trial, dict)
                and isinstance(trial.get("attempt"), int)
                and not trial.get("answer_in_blob")
            ):
                shown[(str(case_id), trial["attempt"])] = trial.get("answer")
    return shown


def _difference(recorded: dict[str, Any], derived: dict[str, Any]) -> str:
    """Name the first place where the recorded body departs from the re-derived one."""
    if "mean" in derived and recorded.get("mean") != derived["mean"]:
        return f"shows mean {recorded.get('mean')!r}; its trials' mean is {derived['mean']}"
    for name in sorted(set(recorded) | set(derived)):
        if name not in derived:
            return f"holds a field {name!r} its trials do not imply"
        if name not in recorded:
            return f"lacks the field {name!r}"
        if name == "cases" and isinstance(recorded[name], dict):
            return _case_difference(recorded[name], derived[name])
        if _canonical(recorded[name]) != _canonical(derived[name]):
            return f"shows {name} {recorded[name]!r}; its trials imply {derived[name]!r}"
    return "differs from what its trials imply"


def _case_difference(recorded: dict[str, Any], derived: dict[str, Any]) -> str:
    for case_id in sorted(set(recorded) | set(derived)):
        if case_id not in derived:
            return f"shows case {case_id}, which none of its trials ran"
        if case_id not in recorded:
            return f"omits case {case_id}"
        got, want = recorded[case_id], derived[case_id]
        if isinstance(got, dict) and got.get("mean") != want["mean"]:
            return (
                f"shows case {case_id} mean {got.get('mean')!r}; its trials' mean is {want['mean']}"
            )
        if _canonical(got) != _canonical(want):
            return _trial_difference(case_id, got, want)
    return "differs from what its trials imply"


def _trial_difference(case_id: str, got: Any, want: dict[str, Any]) -> str:
    """Name the trial of a case whose shown answer departs from the rules' line."""
    got_trials = got.get("trials") if isinstance(got, dict) else None
    if isinstance(got_trials, list) and len(got_trials) == len(want["trials"]):
        for shown, derived in zip(got_trials, want["trials"], strict=True):
            if not isinstance(shown, dict) or _canonical(shown) == _canonical(derived):
                continue
            attempt = derived["attempt"]
            by_digest = bool(shown.get("answer_in_blob"))
            if derived.get("answer_in_blob") and not by_digest:
                return (
                    f"shows the answer of case {case_id} attempt {attempt} inline; the rules "
                    "show it by digest only (over the size cap for answers shown inline)"
                )
            if by_digest and not derived.get("answer_in_blob"):
                return (
                    f"shows the answer of case {case_id} attempt {attempt} by digest only; "
                    "the rules show it inline"
                )
            break
    return f"shows case {case_id} differently from its trials"
