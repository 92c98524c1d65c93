"""The solve-evolve checks: every step in order, scored under H_{t-1}, fixed before it was shown.

A solve-evolve run (``RunOpened.solve_evolve``; docs/PROTOCOL.md, Solve-evolve runs) is
folded with the writer's own rules (:class:`holedger.protocol.evolve.EvolveLog`), and
each problem the fold names fails one check:

* ``evolve_steps``: the pinned stream is what its digest names (no case twice, exactly
  steps x batch cases); every step is its batch's request, trials and evidence, then
  exactly one commit or ``unchanged``, then the next step; no step skipped, none after the
  last, no request of another batch, no commit outside an evolver's turn or two in one,
  no nomination; a completed run has all its steps and its InSituScored. With the
  ``disclosure`` check (each projection is what its own request's trials give) this is
  what shows the evolver saw only past batches: no evidence holds a case before its step;
* ``evolve_parent``: each step's request and every one of its trials ran H_{t-1} (the
  seed for step 1, else the candidate the step before closed on);
* ``evolve_scores_fixed``: every score is recorded before the evidence that disclosed its
  step, and so before H_t (its step's commit comes after the evidence);
* ``evolve_scope``: every commit's parent is H_{t-1} and every changed path lies inside
  the pinned scope;
* ``evolve_step_budget``: each StepClosed's evolver tokens are the sum of the step's
  optimizer-scope calls, and a step committed only within the per-step budget;
* ``in_situ``: J recomputed from the steps' trials (the mean over stream cases of each
  case's mean score), Base the pinned NONE run's J (a NONE run's own J), delta = J - Base;
* ``none_run``: the pinned NONE run is replayed with every check (same trusted keys, from
  the same source as the seed baseline) and must verify, be a ``solve-evolve-none`` run of
  this task digest, seed, stream digest and server key, closing every step unchanged,
  with J and per-case digest as pinned. Without a source of runs it is a warning.

A search run holding StepClosed or InSituScored fails ``evolve_steps``; a search run
without them reports none of these checks.
"""

from __future__ import annotations

from typing import Any

from holedger.ledger.records import Record
from holedger.protocol import evolve, rules
from holedger.replay.inputs import BaselineRun, CheckContext, Unavailable
from holedger.replay.report import ReportBuilder, counted, score_text
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import (
    CandidateCommitted,
    EvolveTerms,
    InSituScored,
    Model,
    RunClosed,
    RunOpened,
    StepClosed,
)

STEPS = "evolve_steps"
PARENT = "evolve_parent"
FIXED = "evolve_scores_fixed"
SCOPE = "evolve_scope"
BUDGET = "evolve_step_budget"
IN_SITU = "in_situ"
NONE_RUN = "none_run"
CHECKS = (
    (STEPS, "every step in order: batch scored, evidence disclosed, one commit or unchanged"),
    (PARENT, "each step's trials ran H_{t-1}"),
    (FIXED, "every score recorded before the evidence that disclosed it, and before H_t"),
    (SCOPE, "every commit on H_{t-1} and inside the editable scope"),
    (BUDGET, "each step's evolver tokens as recorded; commits within the per-step budget"),
    (IN_SITU, "J recomputed from the steps' trials; Base as pinned"),
)
BY_KIND = {
    evolve.ORDER: STEPS,
    evolve.PARENT: PARENT,
    evolve.FIXED: FIXED,
    evolve.SCOPE: SCOPE,
    evolve.BUDGET: BUDGET,
    evolve.SCORE: IN_SITU,
}


class EvolveFold:
    name = "solve_evolve"

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.terms: EvolveTerms | None = ctx.opened.solve_evolve
        self.failures: list[tuple[int | None, str, str, str]] = []
        self.closed: RunClosed | None = None
        self.commits = 0
        self.log: evolve.EvolveLog | None = None
        if self.terms is not None:
            self.log = evolve.EvolveLog(self.terms, ctx.opened.terms.seed_commit)
            for reason in _stream_problems(self.terms):
                self.failures.append((0, "RunOpened", reason, STEPS))

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, RunClosed):
            self.closed = payload
            return
        if self.log is None:
            if isinstance(payload, (StepClosed, InSituScored)):
                reason = f"{rec.type} in a search run, which has no steps"
                self.failures.append((rec.seq, rec.type, reason, STEPS))
            return
        if isinstance(payload, CandidateCommitted) and payload.index > 0:
            self.commits += 1
        for problem in self.log.apply(payload):
            self.failures.append((rec.seq, rec.type, problem.text, BY_KIND[problem.kind]))
        if isinstance(payload, InSituScored):
            self._base(rec.seq, payload)

    def _base(self, seq: int, scored: InSituScored) -> None:
        assert self.terms is not None
        pinned = self.terms.none_run
        if pinned is not None:
            want = pinned.j
        elif self.ctx.opened.optimizer == evolve.NONE_OPTIMIZER:
            want = scored.j
        else:
            want = None
        if scored.base != want:
            shown = "none" if want is None else rational_to_str(want)
            self.failures.append(
                (seq, "InSituScored", f"InSituScored's Base is not the pinned {shown}", IN_SITU)
            )

    def finish(self, out: ReportBuilder) -> None:
        if self.log is None:
            for seq, etype, reason, check in self.failures:
                out.declare(check, CHECKS[0][1])
                out.fail(seq, etype, reason, check=check)
            return
        log, terms = self.log, self.terms
        assert terms is not None
        for name, detail in CHECKS:
            out.declare(name, detail)
        aborted = self.closed is not None and self.closed.reason == "aborted"
        if self.closed is not None and not aborted and self.ctx.cut_after is None:
            if log.phase != "scored":
                self.failures.append(
                    (
                        None,
                        "RunClosed",
                        f"the run closed after {log.step} of its {terms.steps} steps "
                        f"({'with' if log.phase == 'done' else 'without'} its last step closed), "
                        "with no InSituScored",
                        STEPS,
                    )
                )
        for seq, etype, reason, check in self.failures:
            out.fail(seq, etype, reason, check=check)
        failed = {check for *_, check in self.failures}
        unchanged = len(log.closed) - self.commits
        if STEPS not in failed:
            out.check(
                STEPS,
                True,
                f"{len(log.closed)} of {terms.steps} steps of {terms.batch} cases closed in "
                f"order ({counted(self.commits, 'commit')}, {unchanged} unchanged)"
                + (" (aborted)" if aborted else ""),
            )
        if IN_SITU not in failed and log.in_situ is not None:
            s = log.in_situ
            base = "none pinned" if s.base is None else score_text(rational_to_str(s.base))
            out.check(
                IN_SITU,
                True,
                f"J {score_text(rational_to_str(s.j))} over {len(s.per_case)} cases recomputed; "
                f"Base {base}",
            )
        out.section("solve_evolve", self._section())
        self._none(out)

    def _section(self) -> dict[str, Any]:
        log, terms = self.log, self.terms
        assert log is not None and terms is not None
        s = log.in_situ
        return {
            "stream_digest": terms.stream_digest,
            "batch": terms.batch,
            "steps": terms.steps,
            "scope": terms.scope,
            "step_tokens": terms.step_tokens,
            "closed_steps": [
                {
                    "step": c.step,
                    "outcome": c.outcome,
                    "candidate": c.candidate,
                    "evolver_tokens": c.evolver_tokens,
                }
                for c in log.closed
            ],
            "j": None if s is None else rational_to_str(s.j),
            "base": None if s is None or s.base is None else rational_to_str(s.base),
            "delta": None if s is None or s.delta is None else rational_to_str(s.delta),
        }

    def _none(self, out: ReportBuilder) -> None:
        assert self.terms is not None
        pinned = self.terms.none_run
        inputs = self.ctx.inputs
        if pinned is None or inputs.baseline_replay:  # none pinned, or a pinned run's replay
            return
        detail = "the pinned NONE run verifies and scored the pinned Base on this stream"
        if inputs.baselines is None:
            out.warn(NONE_RUN, False, f"not checked: no source of runs to read {pinned.run_id}")
            return
        found = inputs.baselines.baseline(pinned.run_id)
        out.declare(NONE_RUN, detail)
        if isinstance(found, Unavailable):
            if found.fails:
                out.fail(0, "RunOpened", found.reason, check=NONE_RUN)
            else:
                out.warn(NONE_RUN, False, f"not checked: {found.reason}")
            return
        problems = _compare_none(self.ctx.opened, self.terms, found)
        for reason in problems:
            out.fail(0, "RunOpened", reason, check=NONE_RUN)
        if not problems:
            out.check(
                NONE_RUN,
                True,
                f"Base {score_text(rational_to_str(pinned.j))} is the J of NONE run "
                f"{pinned.run_id}, verified ({found.report.events} events)",
            )


def _stream_problems(terms: EvolveTerms) -> list[str]:
    problems = []
    if evolve.stream_digest(terms.split, terms.stream) != terms.stream_digest:
        problems.append("the pinned stream does not have the pinned stream digest")
    if len(set(terms.stream)) != len(terms.stream):
        problems.append("the pinned stream repeats a case")
    if len(terms.stream) != terms.steps * terms.batch:
        problems.append(
            f"the pinned stream has {len(terms.stream)} cases, not {terms.steps} steps x "
            f"{terms.batch}"
        )
    return problems


def _compare_none(opened: RunOpened, terms: EvolveTerms, found: BaselineRun) -> list[str]:
    pinned = terms.none_run
    assert pinned is not None
    name = f"NONE run {found.run_id}"
    if found.run_id != pinned.run_id:
        return [f"the NONE run given is {found.run_id}, not the pinned {pinned.run_id}"]
    if not found.report.verified:
        failed = ", ".join(found.report.failed_checks()) or "unknown"
        return [f"{name} does not verify (failed checks: {failed})"]
    base, scored = found.opened, found.in_situ
    if base is None or scored is None or base.solve_evolve is None:
        return [f"{name} is not a scored solve-evolve run"]
    problems = []
    if base.keys["server"] != opened.keys["server"]:
        problems.append(f"{name} is signed by another server key than this run's")
    if base.task_digest != opened.task_digest or base.terms.seed_commit != opened.terms.seed_commit:
        problems.append(f"{name} is of another task digest or seed than this run's")
    if base.optimizer != evolve.NONE_OPTIMIZER:
        problems.append(f"{name} is not a NONE run (optimizer {base.optimizer!r})")
    if base.solve_evolve.stream_digest != terms.stream_digest:
        problems.append(f"{name} ran another stream than this run's")
    if found.evolved:
        problems.append(f"{name} changed its harness: a NONE run keeps the seed throughout")
    if scored.j != pinned.j:
        problems.append(
            f"{name} scored J {rational_to_str(scored.j)}, the pin says {rational_to_str(pinned.j)}"
        )
    digest = rules.per_case_digest((c.case_id, c.scores) for c in scored.per_case)
    if digest != pinned.per_case_digest:
        problems.append(f"{name}'s per-case scores do not have the pinned digest")
    return problems
