"""What the caller of a replay hands the registered checks: :class:`CheckInputs`.

Each field is one thing a check may need that the log itself does not hold: the task's
cases (leakage audit, case membership, re-scoring), the run's candidate repository (the
candidate scan), a way to replay the run's seed-baseline run (the ``baseline`` check), and
a way to read other runs of the same ledger (the control runs ``audit_controls`` holds
the run's AuditControlEvaluated events to).
A field left empty makes the check that needs it say what it skipped and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

from holedger.ledger.records import Record
from holedger.replay.context import Fold, ReplayContext
from holedger.replay.report import ReplayReport
from holedger.schemas.events import InSituScored, RunOpened, RunScored


@dataclass(frozen=True)
class CaseData:
    """One case: its id, the input the harness gets, the answer only the verifier sees."""

    id: str
    input: Any
    expected: Any


@dataclass(frozen=True)
class TaskData:
    task_id: str
    digest: str
    splits: dict[str, list[CaseData]] = field(default_factory=dict)
    # The task's pinned verifier: (case id, answer as parsed from the harness's output)
    # -> score; None when only the cases were handed in.
    verify: Callable[[str, Any], Fraction] | None = None

    def ids(self, split: str) -> set[str]:
        return {case.id for case in self.splits.get(split, [])}


@dataclass(frozen=True)
class BaselineRun:
    """What the baseline check needs of a baseline run, taken while that run was replayed."""

    run_id: str
    report: ReplayReport
    opened: RunOpened | None
    seed: str | None
    scored: RunScored | None
    # of a solve-evolve run (a NONE run, pinned as its stream's Base): its in-situ score,
    # and whether any candidate beyond the seed was committed
    in_situ: InSituScored | None = None
    evolved: bool = False


@dataclass(frozen=True)
class Unavailable:
    """Why a baseline run cannot be had; ``fails`` when that is itself a fault of the log
    (a home's ledger always holds the baseline runs its runs pin), not a missing file."""

    reason: str
    fails: bool = False


class BaselineSource(Protocol):
    """A way to replay the baseline run another run pins (from a ledger, a bundle, ...)."""

    @property
    def given(self) -> bool:
        """Whether the user named this source (the check then says so when nothing is
        pinned)."""

    def baseline(self, run_id: str) -> BaselineRun | Unavailable:
        """The replayed baseline run ``run_id``, or why it cannot be had."""


class RunSource(Protocol):
    """Other runs' records, as stored (from a ledger, an audits bundle, ...)."""

    def run_records(self, run_id: str) -> list[Record] | None:
        """The records of run ``run_id`` in stream order, or None when it is not here."""


@dataclass(frozen=True)
class CheckInputs:
    """The registered checks' inputs beside the log (each optional)."""

    task: str | None = None  # a task name or folder to load instead of the run's task id
    task_data: TaskData | None = None  # the task's cases, ready (loaded by the caller)
    run_repo: Path | None = None  # this run's candidate repository
    repos: Callable[[str], Path] | None = None  # any run's candidate repository (a home's)
    baselines: BaselineSource | None = None  # None: the check says what to give
    runs: RunSource | None = None  # other runs (control runs); None: not cross-checked
    # This is the replay of a baseline run for another run's check: its own pin (it
    # should have none) is judged by that check and not followed, so pins cannot recurse.
    baseline_replay: bool = False
    # Task data loaded by holedger.replay.taskdata, by (task name, run's task id): a
    # task is loaded once per inputs, however many runs they replay.
    loaded: dict[tuple[str, str], TaskData | str] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def for_baseline(self) -> CheckInputs:
        """The inputs of a baseline run's replay: the same task and home, not this run's
        repository, and its own pinned baseline not followed."""
        return CheckInputs(
            task=self.task, task_data=self.task_data, repos=self.repos, baseline_replay=True
        )


CheckContext = ReplayContext[CheckInputs]
CheckFactory = Callable[[CheckContext], Fold]
