"""The scores projection: recompute RunScored from the held-out trials.

Definitions (the same ``rules`` functions the server uses):

* the held-out trials are the test-split TrialCompleted events of the nominated
  candidate recorded after CandidateNominated; each test case must have exactly K of
  them, attempts 0..K-1;
* per-case scores: that case's K verifier scores in attempt order;
* E(H+) = mean over test cases of the mean over that case's K attempts
  (``rules.expected_score``), an exact rational;
* E(H0) is the task's pinned seed baseline, ``RunOpened.seed_baseline.e_h0``, computed
  once per task with the same K; RunScored must repeat it;
* g = (E(H+) - E(H0)) / (1 - E(H0)) (``rules.normalized_gain``), None when E(H0) = 1.

* the error bars (A3), when RunScored carries them: ``e_h_plus_error`` must be the K
  round means of the held-out trials and their standard error (``rules.round_error``),
  and ``e_h0_error`` the one pinned with the seed baseline.

The ``scores`` section reports E(H+), E(H0), g, their standard errors (from the trials
and the pin, whether RunScored carries them or not), the resolution band and whether g
exceeds it (g > band: the gain is larger than the task's noise resolution).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from holedger.ledger.records import Record
from holedger.protocol import rules
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, score_text, scores_mean_text
from holedger.replay.taskdata import TaskData, task_data
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import (
    CandidateNominated,
    Model,
    RoundError,
    RunClosed,
    RunScored,
    TrialCompleted,
)

CHECK = "scores"


def _r(value: Fraction | None) -> str | None:
    return None if value is None else rational_to_str(value)


class ScoresFold:
    name = "scores"

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.terms = ctx.opened.terms
        self.baseline = ctx.opened.seed_baseline
        self.nominated: str | None = None
        self.heldout: dict[str, dict[int, Fraction]] = {}
        self.scored: RunScored | None = None
        self.scored_seq: int | None = None
        self.failures: list[tuple[int | None, str | None, str]] = []
        self.section: dict[str, Any] = {"scored": False}
        self.aborted = False  # closed by `run abort`: a nomination may stay unscored

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, RunClosed):
            self.aborted = payload.reason == "aborted"
        elif isinstance(payload, CandidateNominated) and self.nominated is None:
            self.nominated = payload.candidate
        elif isinstance(payload, TrialCompleted):
            if (
                payload.split == "test"
                and self.nominated is not None
                and payload.candidate == self.nominated
                and self.scored is None
            ):
                self.heldout.setdefault(payload.case_id, {})[payload.attempt] = payload.score
        elif isinstance(payload, RunScored) and self.scored is None:
            self.scored = payload
            self.scored_seq = rec.seq
            self._check(rec.seq, payload)

    def _fail(self, seq: int | None, reason: str) -> None:
        self.failures.append((seq, "RunScored" if seq is not None else None, reason))

    def _check(self, seq: int, scored: RunScored) -> None:
        k = self.terms.k
        if scored.candidate != self.nominated:
            self._fail(
                seq, f"RunScored scores {scored.candidate[:12]}, not the nominated candidate"
            )
        if scored.k != k:
            self._fail(seq, f"RunScored says K={scored.k}, the task's K is {k}")
        self._check_cases(seq, k)
        derived = {c: [s for _, s in sorted(a.items())] for c, a in self.heldout.items()}
        recorded = {c.case_id: list(c.scores) for c in scored.per_case}
        if len(recorded) != len(scored.per_case):
            self._fail(seq, "RunScored lists a case twice")
        for case_id in sorted(set(recorded) | set(derived)):
            if case_id not in derived:
                self._fail(seq, f"RunScored scores case {case_id}, which has no held-out trial")
            elif case_id not in recorded:
                self._fail(seq, f"RunScored omits case {case_id}")
            elif recorded[case_id] != derived[case_id]:
                self._fail(
                    seq,
                    f"RunScored case {case_id} scores {[_r(s) for s in recorded[case_id]]} "
                    f"differ from its trials' {[_r(s) for s in derived[case_id]]}",
                )
        e_plus = rules.expected_score(derived) if derived else None
        if e_plus is None:
            self._fail(seq, "RunScored with no held-out trials")
        elif scored.e_h_plus != e_plus:
            self._fail(
                seq,
                f"RunScored E(H+) {_r(scored.e_h_plus)} differs from its trials' "
                f"E(H+) {_r(e_plus)}",
            )
        e0 = scored.e_h0
        if self.baseline is not None:
            if scored.e_h0 != self.baseline.e_h0:
                self._fail(
                    seq,
                    f"RunScored E(H0) {_r(scored.e_h0)} is not the pinned seed baseline "
                    f"{_r(self.baseline.e_h0)}",
                )
            if self.baseline.k != k:
                self._fail(seq, f"the pinned seed baseline used K={self.baseline.k}, not {k}")
            e0 = self.baseline.e_h0
        elif self.ctx.opened.optimizer == rules.BASELINE_OPTIMIZER and e_plus is not None:
            # A seed-baseline run scores the seed against itself: its E(H0) is its E(H+).
            if scored.e_h0 != e_plus:
                self._fail(
                    seq,
                    f"a seed-baseline run's E(H0) {_r(scored.e_h0)} is not its own E(H+) "
                    f"{_r(e_plus)}",
                )
        g = rules.normalized_gain(e_plus, e0) if e_plus is not None else None
        if e_plus is not None and scored.g != g:
            self._fail(
                seq,
                f"RunScored g {_r(scored.g)} differs from g {_r(g)} recomputed from its trials "
                f"(E(H+) {_r(e_plus)}, E(H0) {_r(e0)})",
            )
        e_plus_error = rules.round_error(derived.values())
        self._check_errors(seq, scored, e_plus_error)
        e0_error = self.baseline.e_h0_error if self.baseline is not None else None
        band = self.terms.resolution_band
        self.section = {
            "scored": True,
            "candidate": scored.candidate,
            "k": k,
            "cases": len(derived),
            "trials": len(derived) * k,
            "e_h_plus": _r(e_plus),
            "e_h0": _r(e0),
            "e_h0_source": "pinned seed baseline" if self.baseline else "recorded (not pinned)",
            "baseline_run_id": None if self.baseline is None else self.baseline.baseline_run_id,
            "g": _r(g),
            "e_h_plus_se": None if e_plus_error is None else e_plus_error.se,
            "e_h0_se": None if e0_error is None else e0_error.se,
            "resolution_band": _r(band),
            # A5, two-sided: resolved gain (g > b), indistinguishable from 0 (|g| <= b) or
            # resolved loss (g < -b); None when g is undefined (E(H0) = 1).
            "band_outcome": rules.band_outcome(g, band),
            "recorded": {
                "e_h_plus": _r(scored.e_h_plus),
                "e_h0": _r(scored.e_h0),
                "g": _r(scored.g),
            },
        }

    def _check_errors(self, seq: int, scored: RunScored, derived: RoundError | None) -> None:
        """The recorded error bars against the trials' and the pin's (when recorded)."""
        if scored.e_h_plus_error is not None and scored.e_h_plus_error != derived:
            self._fail(
                seq,
                f"RunScored's E(H+) error bar {_error_text(scored.e_h_plus_error)} is not "
                f"that of its trials' round means ({_error_text(derived)})",
            )
        pinned = self.baseline.e_h0_error if self.baseline is not None else None
        if scored.e_h0_error is not None and scored.e_h0_error != pinned:
            self._fail(
                seq,
                f"RunScored's E(H0) error bar {_error_text(scored.e_h0_error)} is not the "
                f"pinned one ({_error_text(pinned)})",
            )

    def _check_cases(self, seq: int, k: int) -> None:
        data = task_data(self.ctx)
        test_size = self.terms.split_sizes.get("test", 0)
        if isinstance(data, TaskData) and data.ids("test"):
            missing = sorted(data.ids("test") - set(self.heldout))
            if missing:
                self._fail(seq, f"test case {missing[0]} was never scored ({len(missing)} missing)")
            extra = sorted(set(self.heldout) - data.ids("test"))
            if extra:
                self._fail(seq, f"held-out trial of {extra[0]}, which is not a test case")
        elif len(self.heldout) != test_size:
            self._fail(
                seq, f"{len(self.heldout)} test cases scored, the test split has {test_size}"
            )
        for case_id, attempts in sorted(self.heldout.items()):
            if set(attempts) != set(range(k)):
                self._fail(
                    seq,
                    f"test case {case_id} has attempts {sorted(attempts)}, not K={k} (0..{k - 1})",
                )
                break

    def finish(self, out: ReportBuilder) -> None:
        out.declare(CHECK, "RunScored equals the scores recomputed from the held-out trials")
        unscored = self.nominated is not None and self.scored is None
        if unscored and self.ctx.cut_after is None and not self.aborted:
            self._fail(None, "the nominated candidate was never scored (no RunScored)")
        for seq, etype, reason in self.failures:
            out.fail(seq, etype, reason, check=CHECK)
        if not self.failures:
            if unscored and self.aborted:
                out.check(CHECK, True, "no RunScored: the run was aborted before it was scored")
            elif unscored:
                out.check(CHECK, True, "no RunScored, which may lie past the break: not judged")
            elif self.scored is None:
                why = "the run was aborted" if self.aborted else "the run has no score"
                out.check(CHECK, True, f"no RunScored: {why}")
            else:
                out.check(
                    CHECK,
                    True,
                    f"E(H+) {scores_mean_text(self.section, 'e_h_plus')}, recomputed from "
                    f"{self.section['cases']} cases x K; E(H0) "
                    f"{score_text(self.section['e_h0'])} {_baseline_text(self.section)}; "
                    f"g {score_text(self.section['g'])} from the two",
                )
        out.section("scores", self.section)


def _error_text(error: RoundError | None) -> str:
    if error is None:
        return "none"
    rounds = ", ".join(rational_to_str(r) for r in error.round_means)
    return f"se {error.se} of rounds [{rounds}]"


def _baseline_text(section: dict[str, Any]) -> str:
    """Where E(H0) comes from: a baseline run of its own, checked by verifying that run."""
    run = section.get("baseline_run_id")
    if section.get("e_h0_source") != "pinned seed baseline":
        return "as recorded (no seed baseline pinned)"
    if run:
        return f"as pinned from baseline run {run} (see the baseline check)"
    return "as pinned (no baseline run named)"
