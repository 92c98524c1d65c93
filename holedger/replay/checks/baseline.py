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

Where the baseline run comes from is the caller's: ``replay`` reads it from the same
ledger (:class:`LedgerBaselines`), ``verify`` from the bundle given with ``--baseline``
(:class:`BundleBaselines`). Without the baseline bundle, the check is a warning that says
so and what to give; the verdict does not depend on it. A mismatch fails the verdict, and
so do what only a rewritten log can hold: a scored run (not itself a baseline run) with
no pinned baseline, and, replayed from a ledger, a pinned baseline run that is not in it
(the server pins only runs of its own ledger). A pin that names no run (only a hand-made
log has one) is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

from holedger.errors import HoledgerError
from holedger.ledger.keys import PublicKey
from holedger.ledger.records import Record
from holedger.protocol import rules
from holedger.replay.engine import FoldFactory, ReplayContext
from holedger.replay.report import ReplayReport, ReportBuilder, score_text
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import (
    CandidateCommitted,
    Model,
    RunOpened,
    RunScored,
    SeedBaseline,
)

CHECK = "baseline"
EXTRA_KEY = "baselines"


@dataclass(frozen=True)
class BaselineRun:
    """What the check needs of a baseline run, taken while that run was replayed."""

    run_id: str
    report: ReplayReport
    opened: RunOpened | None
    seed: str | None
    scored: RunScored | None


@dataclass(frozen=True)
class Unavailable:
    """Why a baseline run cannot be had; ``fails`` when that is itself a fault of the log
    (a home's ledger always holds the baseline runs its runs pin), not a missing file."""

    reason: str
    fails: bool = False


class BaselineSource(Protocol):
    def baseline(self, run_id: str) -> BaselineRun | Unavailable:
        """The replayed baseline run ``run_id``, or why it cannot be had."""


class _Capture:
    """A projection that keeps what the baseline check reads of a replayed run."""

    name = "baseline_capture"

    def __init__(self, ctx: ReplayContext, into: dict[str, object]) -> None:
        self.into = into
        into["opened"] = ctx.opened

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, CandidateCommitted) and payload.index == 0:
            self.into.setdefault("seed", payload.candidate)
        elif isinstance(payload, RunScored):
            self.into.setdefault("scored", payload)

    def finish(self, out: ReportBuilder) -> None:
        return None


def capturing(
    projections: Sequence[FoldFactory],
) -> tuple[list[FoldFactory], dict[str, object]]:
    """``projections`` plus one that captures a baseline run's facts into the dict returned."""
    facts: dict[str, object] = {}

    def capture(ctx: ReplayContext) -> _Capture:
        return _Capture(ctx, facts)

    return [*projections, capture], facts


def baseline_run(run_id: str, report: ReplayReport, facts: dict[str, object]) -> BaselineRun:
    opened = facts.get("opened")
    seed = facts.get("seed")
    scored = facts.get("scored")
    return BaselineRun(
        run_id=run_id,
        report=report,
        opened=opened if isinstance(opened, RunOpened) else None,
        seed=seed if isinstance(seed, str) else None,
        scored=scored if isinstance(scored, RunScored) else None,
    )


# What a baseline run's own replay takes from the replay of the run that pins it: where the
# task is (for re-scoring and the leakage audit) and the home (for its candidate repository).
SHARED_EXTRA = ("task", "task_data", "settings")


class LedgerBaselines:
    """Baseline runs read from the ledger the run itself is in (each replayed once)."""

    def __init__(
        self,
        ledger: object,
        trusted_keys: Sequence[PublicKey],
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self.ledger = ledger
        self.trusted_keys = list(trusted_keys)
        self.extra = {k: v for k, v in (extra or {}).items() if k in SHARED_EXTRA}
        self._seen: dict[str, BaselineRun | Unavailable] = {}

    def baseline(self, run_id: str) -> BaselineRun | Unavailable:
        if run_id not in self._seen:
            self._seen[run_id] = self._replay(run_id)
        return self._seen[run_id]

    def _replay(self, run_id: str) -> BaselineRun | Unavailable:
        from holedger.ledger.store import Ledger
        from holedger.replay.checks import CHECKS
        from holedger.replay.engine import replay_run

        assert isinstance(self.ledger, Ledger)
        # The server pins only baseline runs of its own ledger: one that is not there (or
        # an id that is no run id at all) is a fault of the log, not a file to ask for.
        try:
            stored = self.ledger.stored_count(run_id)
        except HoledgerError as exc:
            return Unavailable(f"the pinned baseline run id is unusable: {exc.message}", True)
        if not stored:
            return Unavailable(f"the pinned baseline run {run_id} is not in this ledger", True)
        projections, facts = capturing(CHECKS)
        report = replay_run(
            self.ledger,
            run_id,
            trusted_keys=self.trusted_keys,
            projections=projections,
            extra={**self.extra, EXTRA_KEY: None},  # its own pin, if any, is not followed
        )
        return baseline_run(run_id, report, facts)


class BundleBaselines:
    """The baseline run in a bundle file given with ``verify --baseline``: it is verified
    when first asked for (an unreadable file raises the bundle's error, naming the file)."""

    given = True  # named by the user: the check says so when the run pins no baseline

    def __init__(
        self, path: str | Path, trusted_keys: Sequence[PublicKey], task: str | None = None
    ) -> None:
        self.path = Path(path)
        self.trusted_keys = list(trusted_keys)
        self.task = task
        self._found: BaselineRun | None = None

    def baseline(self, run_id: str) -> BaselineRun | Unavailable:
        if self._found is None:
            self._found = self._verify()
        return self._found  # another run than ``run_id`` fails the comparison

    def _verify(self) -> BaselineRun:
        from holedger.replay.bundle import verify_bundle
        from holedger.replay.checks import CHECKS

        projections, facts = capturing(CHECKS)
        try:
            report = verify_bundle(
                self.path,
                trusted_keys=self.trusted_keys,
                projections=projections,
                task=self.task,
                baseline=None,
            )
        except HoledgerError as exc:  # the same error, naming the file it is about
            raise type(exc)(f"baseline bundle {self.path}: {exc.message}", hint=exc.hint) from exc
        return baseline_run(report.run_id, report, facts)


class BaselineFold:
    name = "baseline"

    def __init__(self, ctx: ReplayContext) -> None:
        self.ctx = ctx
        self.pinned: SeedBaseline | None = ctx.opened.seed_baseline
        # Absent: the caller has no source of baseline runs (the check says what to give);
        # None: this is a baseline run's own replay, whose pinned baseline (it should have
        # none) is not followed, so a cycle of pins cannot recurse.
        source = ctx.extra.get(EXTRA_KEY, ())
        self.nested = source is None
        self.source = cast(BaselineSource, source) if hasattr(source, "baseline") else None

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
            elif getattr(self.source, "given", False):
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
    return problems
