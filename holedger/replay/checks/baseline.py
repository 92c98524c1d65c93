"""The seed-baseline check: the pinned E(H0) is what the named baseline run scored.

Every run of a task pins ``RunOpened.seed_baseline`` (``e_h0``, ``k``,
``baseline_run_id``, ``per_case_digest``) from the task's baseline run: a run of its own,
optimizer label ``seed-baseline``, that nominated the seed and was scored on the test split
like any run. The ``scores`` check takes E(H0) as pinned; this check (``baseline``)
verifies the baseline run itself (all of replay's checks, under the same trusted keys)
and compares:

* it verifies, and is closed;
* its run id is the pinned one, its server key is this run's server key, its task digest
  and seed commit are this run's, its optimizer label is ``seed-baseline`` and it pins no
  baseline of its own;
* it scored its seed commit (the candidate of its ``CandidateCommitted`` index 0);
* its ``RunScored``: K and E(H+) equal the pinned ``k`` and ``e_h0`` (and this run's K),
  and the digest of its per-case scores (``rules.per_case_digest``) the pinned one.

Where the baseline run comes from is the caller's, who hands the check a way to replay it
(``CheckInputs.baselines``, a :class:`~holedger.replay.inputs.BaselineSource`): ``replay``
reads it from the same ledger (holedger.replay.runs.LedgerBaselines), ``verify`` from the
bundle given with ``--baseline`` (BundleBaselines, beside the bundle verifier). Without
the baseline bundle, the check is a warning that says so and what to give; the verdict
does not depend on it. A mismatch fails the verdict, and so do what only a rewritten log
can hold: a scored run (not itself a baseline run) with no pinned baseline, and, replayed
from a ledger, a pinned baseline run that is not in it (the server pins only runs of its
own ledger). A pin that names no run (only a hand-made
log has one) is a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from holedger.ledger.records import Record
from holedger.protocol import rules
from holedger.replay.inputs import BaselineRun, CheckContext, CheckFactory, Unavailable
from holedger.replay.report import ReplayReport, ReportBuilder, score_text
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import (
    CandidateCommitted,
    InSituScored,
    Model,
    RunOpened,
    RunScored,
    SeedBaseline,
)

CHECK = "baseline"


@dataclass
class Captured:
    """What the baseline check reads of a replayed baseline run, filled in as it replays."""

    opened: RunOpened | None = None
    seed: str | None = None  # the candidate of its CandidateCommitted index 0
    scored: RunScored | None = None  # its first RunScored
    in_situ: InSituScored | None = None  # a solve-evolve run's first InSituScored
    evolved: bool = False  # a candidate beyond the seed was committed


class _Capture:
    """A fold that fills in a :class:`Captured` while a baseline run is replayed."""

    name = "baseline_capture"

    def __init__(self, ctx: CheckContext, into: Captured) -> None:
        self.into = into
        into.opened = ctx.opened

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, CandidateCommitted) and payload.index == 0:
            if self.into.seed is None:
                self.into.seed = payload.candidate
        elif isinstance(payload, CandidateCommitted):
            self.into.evolved = True
        elif isinstance(payload, RunScored) and self.into.scored is None:
            self.into.scored = payload
        elif isinstance(payload, InSituScored) and self.into.in_situ is None:
            self.into.in_situ = payload

    def finish(self, out: ReportBuilder) -> None:
        return None


def capturing(checks: Sequence[CheckFactory]) -> tuple[list[CheckFactory], Captured]:
    """``checks`` plus a fold that captures a baseline run's facts into what is returned."""
    facts = Captured()

    def capture(ctx: CheckContext) -> _Capture:
        return _Capture(ctx, facts)

    return [*checks, capture], facts


def baseline_run(run_id: str, report: ReplayReport, facts: Captured) -> BaselineRun:
    return BaselineRun(
        run_id=run_id,
        report=report,
        opened=facts.opened,
        seed=facts.seed,
        scored=facts.scored,
        in_situ=facts.in_situ,
        evolved=facts.evolved,
    )


class BaselineFold:
    name = "baseline"

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.pinned: SeedBaseline | None = ctx.opened.seed_baseline
        # No source: the caller has no way to replay baseline runs (the check says what to
        # give). A baseline run's own replay: its pinned baseline (it should have none) is
        # not followed, so a cycle of pins cannot recurse.
        self.nested = ctx.inputs.baseline_replay
        self.source = None if self.nested else ctx.inputs.baselines

        self.scored = False

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, RunScored):
            self.scored = True

    def _unchecked(self, out: ReportBuilder, reason: str, **section: object) -> None:
        """The check did not run: a warning saying why (the verdict does not depend on it)."""
        out.warn(CHECK, False, reason)
        out.section("baseline", {"checked": False, "reason": reason, **section})

    def finish(self, out: ReportBuilder) -> None:
        pinned = self.pinned
        opened = self.ctx.opened
        if self.nested:
            return  # a baseline run's own replay: its pin, if any, is judged by the caller
        if pinned is None:
            if self.scored and opened.optimizer != rules.BASELINE_OPTIMIZER:
                # The server scores a run only against a pinned baseline; a scored run
                # without one had its E(H0) written by hand (or its pin removed).
                out.declare(CHECK, "the pinned E(H0) is what the named baseline run scored")
                out.fail(
                    0,
                    "RunOpened",
                    f"a scored run of optimizer {opened.optimizer!r} pins no seed baseline: "
                    "its E(H0) comes from nowhere the log can show",
                    check=CHECK,
                )
            elif self.source is not None and self.source.given:
                self._unchecked(out, "the run pins no seed baseline: --baseline not used")
            return
        run_id = pinned.baseline_run_id
        if run_id is None:
            self._unchecked(out, "E(H0) is pinned without naming a baseline run to check")
            return
        if self.source is None:
            self._unchecked(
                out,
                f"not checked: E(H0) is pinned from baseline run {run_id}; give its bundle "
                "with --baseline",
                run_id=run_id,
            )
            return
        found = self.source.baseline(run_id)
        out.declare(CHECK, "the pinned E(H0) is what the named baseline run scored")
        if isinstance(found, Unavailable):
            if found.fails:
                out.fail(0, "RunOpened", found.reason, check=CHECK)
                out.section("baseline", {"checked": False, "reason": found.reason})
            else:
                self._unchecked(out, f"not checked: {found.reason}", run_id=run_id)
            return
        problems = _compare(self.ctx.opened, pinned, found)
        for reason in problems:
            out.fail(0, "RunOpened", reason, check=CHECK)
        warned = [c.name for c in found.report.checks if c.level == "warning" and not c.ok]
        section = {
            "checked": True,
            "run_id": run_id,
            "verified": found.report.verified,
            "events": found.report.events,
            "failed_checks": found.report.failed_checks(),
            "warnings": warned,
            "matches": not problems,
        }
        out.section("baseline", section)
        if not problems:
            digest = "per-case scores as pinned"
            if pinned.per_case_digest is None:
                digest = "no per-case digest pinned"
            out.check(
                CHECK,
                True,
                f"E(H0) {score_text(rational_to_str(pinned.e_h0))} is the E(H+) of baseline "
                f"run {run_id}, verified ({found.report.events} events): same task digest, "
                f"seed, server key and K; {digest}"
                + (f" (its warnings: {', '.join(warned)})" if warned else ""),
            )


def _compare(opened: RunOpened, pinned: SeedBaseline, found: BaselineRun) -> list[str]:
    """What is wrong with ``found`` as the baseline ``pinned`` names (empty: nothing)."""
    name = f"baseline run {found.run_id}"
    if found.run_id != pinned.baseline_run_id:
        return [
            f"the baseline given is run {found.run_id}, not the pinned {pinned.baseline_run_id}"
        ]
    if not found.report.verified:
        failed = ", ".join(found.report.failed_checks()) or "unknown"
        return [f"{name} does not verify (failed checks: {failed})"]
    base = found.opened
    scored = found.scored
    if base is None or scored is None:
        return [f"{name} has no {'RunOpened' if base is None else 'RunScored'}"]
    problems: list[str] = []
    if base.keys["server"] != opened.keys["server"]:
        key = base.keys["server"]
        problems.append(f"{name} is signed by server key {key.name}+{key.key_id}, not this run's")
    if base.task_digest != opened.task_digest:
        problems.append(f"{name} is of task digest {base.task_digest}, not this run's")
    if base.terms.seed_commit != opened.terms.seed_commit:
        problems.append(f"{name} starts from seed {base.terms.seed_commit}, not this run's")
    if base.optimizer != rules.BASELINE_OPTIMIZER or base.seed_baseline is not None:
        problems.append(
            f"{name} is not a seed-baseline run (optimizer {base.optimizer!r}"
            f"{', pins a baseline of its own' if base.seed_baseline is not None else ''})"
        )
    if found.seed != base.terms.seed_commit or scored.candidate != base.terms.seed_commit:
        problems.append(
            f"{name} scored candidate {scored.candidate[:12]}, not its seed "
            f"{base.terms.seed_commit[:12]}"
            + ("" if found.seed == base.terms.seed_commit else " (committed first: another)")
        )
    if scored.k != pinned.k or pinned.k != opened.terms.k:
        problems.append(
            f"{name} scored with K={scored.k}; the pin says K={pinned.k}, this run's K is "
            f"{opened.terms.k}"
        )
    if scored.e_h_plus != pinned.e_h0:
        problems.append(
            f"{name} scored E(H+) {rational_to_str(scored.e_h_plus)}, the pinned E(H0) is "
            f"{rational_to_str(pinned.e_h0)}"
        )
    digest = rules.per_case_digest((c.case_id, c.scores) for c in scored.per_case)
    if pinned.per_case_digest is not None and digest != pinned.per_case_digest:
        problems.append(f"{name}'s per-case scores do not have the pinned digest")
    error = rules.round_error(c.scores for c in scored.per_case)
    if pinned.e_h0_error is not None and pinned.e_h0_error != error:
        problems.append(
            f"the pinned E(H0) error bar (se {pinned.e_h0_error.se}) is not that of {name}'s "
            f"round means (se {None if error is None else error.se})"
        )
    return problems
