"""The trusted server's operations: open a run, commit, evaluate, nominate and score.

:class:`RunService` is the one object the HTTP API, the command line and the demo use; it
composes the server's parts, each a module of its own:

- :mod:`~holedger.server.core`: the ledger, a run's state, task and repository, the one
  way to decide (fold, decide, append at the folded head; on a lost race again), the trial
  machinery and the executor (:mod:`~holedger.server.executor`);
- :mod:`~holedger.server.lifecycle`: opening a run, aborting one;
- :mod:`~holedger.server.commits`: committing candidates;
- :mod:`~holedger.server.evaluation`: budgeted dev and val requests and their trials
  (:mod:`~holedger.server.dispatch`);
- :mod:`~holedger.server.heldout`: the nomination, held-out scoring and closing the run;
- :mod:`~holedger.server.recovery`: requests a stopped server left unrecorded;
- :mod:`~holedger.server.baseline`: the pinned seed baseline E(H0);
- :mod:`~holedger.server.reading`: what the optimizer may read of its run.

Run lifecycle: RunOpened (task terms, task digest, pinned seed baseline), the seed as
CandidateCommitted index 0, then any number of CandidateCommitted and EvaluationRequested
(each accepted request followed by its TrialCompleted, SafetyViolation and one
DisclosureProjected), then CandidateNominated, the held-out EvaluationRequested on the
test split (K attempts per test case, outside the search budget) with its trials,
RunScored and RunClosed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from holedger.config import Settings
from holedger.ledger.store import Ledger
from holedger.schemas.events import ControlOf, OptimizerDescriptor, RescoreOf, SeedBaseline
from holedger.server import baseline, evaluation, heldout, lifecycle, reading, recovery
from holedger.server.candidates import CandidateRepo, FileMap, TreeLimits
from holedger.server.commits import CommittedCandidate, commit_candidate
from holedger.server.core import DEFAULT_WORKERS, RunConfig, ServerConfig, ServerCore
from holedger.server.dispatch import EvaluationInterrupted
from holedger.server.evaluation import Evaluation
from holedger.server.executor import Executor
from holedger.server.heldout import ScoredRun
from holedger.server.lifecycle import AbortedRun, OpenedRun
from holedger.server.progress import ProgressHook
from holedger.server.recovery import Recovery
from holedger.server.state import CandidateInfo, RunState, StateCache
from holedger.server.taskview import ServerTask
from holedger.server.trials import TrialGateway

__all__ = [
    "DEFAULT_WORKERS",
    "CommittedCandidate",
    "Evaluation",
    "EvaluationInterrupted",
    "OpenedRun",
    "Recovery",
    "RunConfig",
    "RunService",
    "ScoredRun",
    "ServerConfig",
]


class RunService:
    """The server's Python API. Thread-safe; one per process and ledger."""

    def __init__(
        self, settings: Settings, ledger: Ledger, config: ServerConfig | None = None
    ) -> None:
        """``config``: how the server is set up (:class:`ServerConfig`; None: its
        defaults)."""
        self.core = ServerCore(settings, ledger, config or ServerConfig())

    # ------------------------------------------------------------------ shared parts

    @property
    def settings(self) -> Settings:
        return self.core.settings

    @property
    def ledger(self) -> Ledger:
        return self.core.ledger

    @property
    def states(self) -> StateCache:
        return self.core.states

    @property
    def workers(self) -> int:
        """Trials of one evaluation in flight at once."""
        return self.core.workers

    @workers.setter
    def workers(self, workers: int) -> None:
        self.core.workers = workers

    @property
    def tree_limits(self) -> TreeLimits:
        """The size limits of a candidate tree."""
        return self.core.tree_limits

    @tree_limits.setter
    def tree_limits(self, limits: TreeLimits) -> None:
        self.core.tree_limits = limits

    @property
    def default_backend(self) -> str | None:
        """The sandbox backend of runs opened without one (None: the strongest)."""
        return self.core.default_backend

    @default_backend.setter
    def default_backend(self, backend: str | None) -> None:
        self.core.default_backend = backend

    @property
    def executor(self) -> Executor:
        return self.core.executor

    @property
    def trial_progress(self) -> ProgressHook | None:
        """Called with (label, done, total) as each trial ends (server/progress.py)."""
        return self.core.trial_progress

    @trial_progress.setter
    def trial_progress(self, hook: ProgressHook | None) -> None:
        self.core.trial_progress = hook

    @property
    def in_flight(self) -> int:
        """Evaluations and nominations now running."""
        return self.core.in_flight

    def drain(self, timeout: float | None = None) -> int:
        """Refuse new evaluations and nominations and wait (up to ``timeout``) for those
        in flight to be recorded; returns how many still run (0: all were recorded). A
        server stopped without draining leaves an accepted request without its trials."""
        return self.core.drain(timeout)

    def close(self) -> None:
        self.core.close()

    def task(self, ref: str) -> ServerTask:
        return self.core.task(ref)

    def run_task(self, run_id: str) -> ServerTask:
        return self.core.run_task(run_id)

    def repo(self, run_id: str) -> CandidateRepo:
        return self.core.repo(run_id)

    def gateway(self) -> TrialGateway | None:
        return self.core.gateway()

    def state(self, run_id: str) -> RunState:
        return self.core.state(run_id)

    # ------------------------------------------------------------------ operations

    def open_run(
        self,
        task_ref: str,
        *,
        optimizer: str = "unnamed",
        backend: str | None = None,
        baseline: bool = True,
        descriptor: OptimizerDescriptor | None = None,
        rescore_of: RescoreOf | None = None,
        control_of: ControlOf | None = None,
        seed_variant: str | None = None,
    ) -> OpenedRun:
        """RunOpened pinning the task and its seed baseline; the seed (or the task's seed
        variant ``seed_variant``) as candidate 0."""
        return lifecycle.open_run(
            self.core,
            task_ref,
            optimizer=optimizer,
            backend=backend,
            baseline=baseline,
            descriptor=descriptor,
            rescore_of=rescore_of,
            control_of=control_of,
            seed_variant=seed_variant,
        )

    def commit_candidate(
        self, run_id: str, source: Path | FileMap, parent: str | None = None
    ) -> CommittedCandidate:
        """Commit a candidate tree (a folder or a file map); refuse it with nothing recorded
        when it breaks a rule (see :mod:`holedger.server.candidates`)."""
        return commit_candidate(self.core, run_id, source, parent)

    def evaluate(
        self,
        run_id: str,
        candidate: str,
        split: str,
        case_ids: Sequence[str] | None = None,
        attempts: int = 1,
    ) -> Evaluation:
        """A budgeted evaluation: gate, record, run the trials, project, return the projection.

        A request refused by the rules or the budget is recorded (decision "rejected" with
        the reason) and raised as PolicyError / BudgetExceededError.
        """
        with self.core.work():
            return evaluation.evaluate(self.core, run_id, candidate, split, case_ids, attempts)

    def nominate(self, run_id: str, candidate: str, *, wait: bool = True) -> ScoredRun:
        """Nominate once, score the candidate on every test case K times, close the run
        (:mod:`holedger.server.heldout`)."""
        return heldout.nominate(self.core, run_id, candidate, wait=wait)

    def recover(self, run_id: str) -> Recovery:
        """Record what a server that stopped mid-evaluation left unrecorded in ``run_id``
        (:mod:`holedger.server.recovery`)."""
        return recovery.recover(self.core, run_id)

    def abort(self, run_id: str, why: str) -> AbortedRun:
        """Close ``run_id`` as aborted (:func:`holedger.server.lifecycle.abort_run`)."""
        return lifecycle.abort_run(self.core, run_id, why)

    def baseline_path(self, task: ServerTask) -> Path:
        return baseline.baseline_path(self.core, task)

    def ensure_baseline(self, task_ref: str, *, backend: str | None = None) -> SeedBaseline:
        """The task's pinned E(H0) (:mod:`holedger.server.baseline`)."""
        return lifecycle.pinned_baseline(self.core, task_ref, backend)

    # ------------------------------------------------------------------ reading

    def run_info(self, run_id: str) -> dict[str, Any]:
        """What the optimizer may know about its run (no test data)."""
        return reading.run_info(self.core, run_id)

    def disclosed_blob(self, run_id: str, digest: str) -> bytes:
        """A blob this run's optimizer was shown (by digest in a projection); else NotFound."""
        return reading.disclosed_blob(self.core, run_id, digest)

    def projections(self, run_id: str) -> dict[str, Any]:
        """The run's projections: request id and digest, in recorded order."""
        return reading.projections(self.core, run_id)

    def projection(self, run_id: str, request_id: str) -> dict[str, Any]:
        """One projection shown to the run's optimizer, as recorded; else NotFound."""
        return reading.projection(self.core, run_id, request_id)

    def candidate_info(self, run_id: str, ref: str) -> CandidateInfo:
        return reading.candidate_info(self.core, run_id, ref)
