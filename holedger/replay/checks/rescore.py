"""Re-scoring: every recorded score is what the task's pinned verifier gives its answer.

A trial's score is a fact the server signs. With the task at hand (found by name, or given
with ``--task``, and of the pinned digest), replay re-parses each trial's recorded output
exactly as the server did (``protocol.answers.parse_answer``), checks that the answer digest
is that answer's, and runs the verifier on it: the recorded score must be what it gives.
A trial without output (never run) must score 0. Nothing is run in a sandbox: the
verifier is the task's own scoring function, run here as the server ran it.

Timeouts (``timeouts``, on every trial, task at hand or not): when the terms state the
timeout rule (``TaskTerms.timeout_score``), a trial killed at its time limit scores 0
under ``zero`` (the default, A3) and whatever its answer earns under ``verifier``; the
re-scoring applies the same rule (``rules.trial_score``). Logs whose terms predate the
rule are not judged on it, and the check says so.

What this catches: a score that does not follow from the recorded answer (a log re-signed
by a key holder with higher scores). What it cannot catch: an answer made up whole, with
its output, by whoever holds the key (see docs/PROTOCOL.md, "What a verified run proves").
Outputs left out of a redacted bundle are counted as not re-scored.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from holedger.errors import HoledgerError
from holedger.ledger.records import Record
from holedger.protocol.answers import answer_digest, parse_answer
from holedger.protocol.rules import trial_score
from holedger.replay.inputs import CheckContext
from holedger.replay.report import ReportBuilder, counted
from holedger.replay.taskdata import TaskData, task_data
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import Model, TrialCompleted

CHECK = "rescored"
TIMEOUTS = "timeouts"


class RescoreFold:
    name = "rescore"

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        # Resolved at the first trial: the task's verifier and case ids, or why not.
        self.skipped: str | None = None
        self.verify: Callable[[str, Any], Fraction] | None = None
        self.known: set[str] = set()
        self.resolved = False
        self.checked = 0
        self.withheld = 0
        self.failures: list[tuple[int, str]] = []
        self.timeout_rule = ctx.opened.terms.timeout_score
        self.timed_out = 0
        self.timeout_failures: list[tuple[int, str]] = []

    def _resolve(self) -> None:
        self.resolved = True
        data = task_data(self.ctx)  # cached per replay: the leakage audit reuses it
        if not isinstance(data, TaskData):
            self.skipped = data
        elif data.verify is None:
            self.skipped = "the task's verifier was not given, only its cases"
        else:
            self.verify = data.verify
            self.known = {case.id for cases in data.splits.values() for case in cases}

    def apply(self, rec: Record, payload: Model) -> None:
        """Re-score each trial as it comes: nothing is kept but counts and failures."""
        if not isinstance(payload, TrialCompleted):
            return
        if payload.timed_out:
            self.timed_out += 1
            if self.timeout_rule == "zero" and payload.score != 0:
                self.timeout_failures.append(
                    (
                        rec.seq,
                        f"trial {payload.trial_id} timed out and scores "
                        f"{rational_to_str(payload.score)}; the task's timeouts score 0",
                    )
                )
        if not self.resolved:
            self._resolve()
        if self.verify is None:
            return
        problem = self._problem(payload, self.verify)
        if problem == "withheld":
            self.withheld += 1
        elif problem is not None:
            self.failures.append((rec.seq, f"trial {payload.trial_id}: {problem}"))
        else:
            self.checked += 1

    def finish(self, out: ReportBuilder) -> None:
        self._finish_timeouts(out)
        out.declare(CHECK, "every recorded score is the task verifier's score of its answer")
        if not self.resolved:
            self._resolve()  # no trial: still say whether the task was at hand
        if self.skipped is not None:
            out.check(CHECK, True, f"re-scoring skipped: {self.skipped}")
            out.section(CHECK, {"status": "skipped", "reason": self.skipped})
            return
        for seq, reason in self.failures:
            out.fail(seq, "TrialCompleted", reason, check=CHECK)
        checked, withheld = self.checked, self.withheld
        out.section(CHECK, {"status": "done", "rescored": checked, "not_rescored": withheld})
        if out.ok(CHECK):
            note = f"; {counted(withheld, 'output')} withheld, not re-scored" if withheld else ""
            out.check(
                CHECK,
                True,
                f"{counted(checked, 'trial')} re-scored by the task's verifier: every "
                f"recorded score agrees{note}",
            )

    def _finish_timeouts(self, out: ReportBuilder) -> None:
        out.declare(TIMEOUTS, "every timed-out trial scores as the task's timeout rule says")
        for seq, reason in self.timeout_failures:
            out.fail(seq, "TrialCompleted", reason, check=TIMEOUTS)
        if self.timeout_failures:
            return
        n = counted(self.timed_out, "timed-out trial")
        if self.timeout_rule is None:
            note = f"{n}; the terms state no timeout rule (written before it): not judged"
        elif self.timeout_rule == "zero":
            note = f"{n}, each scored 0 as the task's timeouts are"
        else:
            note = f"{n}, scored by the verifier as the task's terms say"
        out.check(TIMEOUTS, True, note)

    def _problem(self, trial: TrialCompleted, verify: Callable[[str, Any], Fraction]) -> str | None:

        if trial.output_digest is None:
            if trial.answer_digest is not None or trial.score != 0:
                return "has an answer or a score but no recorded output"
            return None
        output = self.ctx.blobs.blob(trial.output_digest)
        if output is None:
            return "withheld"
        natural, recorded = parse_answer(output)
        digest = None if recorded is None else answer_digest(recorded)
        if digest != trial.answer_digest:
            return "its answer digest is not that of the answer its output holds"
        if recorded is None:
            score = Fraction(0)
        elif trial.case_id not in self.known:
            return f"case {trial.case_id} is not in the task"
        else:
            try:
                score = verify(trial.case_id, natural)
            except HoledgerError as exc:
                return f"the verifier refused its answer: {exc.message}"
            if self.timeout_rule is not None:
                score = trial_score(
                    score, timed_out=trial.timed_out, timeout_score=self.timeout_rule
                )
        if score != trial.score:
            return (
                f"recorded score {rational_to_str(trial.score)}, but the task's verifier "
                f"scores its answer {rational_to_str(score)}"
            )
        return None
