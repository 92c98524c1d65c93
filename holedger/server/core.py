"""What every operation of the server shares: the ledger, a run's state, its task and
repository, the trial machinery, and the one way to decide.

Every operation follows one pattern: fold the run's events into its current state
(:class:`~holedger.server.state.StateCache`), decide with the pure rules
(:mod:`holedger.protocol.rules`), and append the decision with ``expected_seq`` = the head
it was decided on (:meth:`ServerCore.decide`). When another writer (a thread, a process,
the gateway) appended first, the ledger raises LedgerConflictError and the operation folds
again and decides again, so the budget gate is atomic without any lock outside the ledger.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from holedger.config import Settings
from holedger.errors import (
    HoledgerError,
    LedgerConflictError,
    NotFoundError,
    PolicyError,
    Unavailable,
    UsageError,
)
from holedger.ledger.store import Ledger
from holedger.sandboxes import Limits, get_backend
from holedger.schemas.events import EvaluationRequested
from holedger.server import dispatch, taskview
from holedger.server.candidates import DEFAULT_LIMITS, CandidateRepo, TreeLimits
from holedger.server.dispatch import Item
from holedger.server.executor import Executor, make_executor
from holedger.server.progress import ProgressHook
from holedger.server.seeds import with_run_seed
from holedger.server.state import RunState, StateCache
from holedger.server.taskview import CaseData, ServerTask
from holedger.server.trials import TrialGateway, TrialOutcome, TrialRunner

DEFAULT_WORKERS = 2
MAX_DECIDE_ATTEMPTS = 200
T = TypeVar("T")


@dataclass
class RunConfig:
    """Server-side settings of a run kept beside its repository (not evidence)."""

    task: str
    backend: str | None

    @staticmethod
    def path(settings: Settings, run_id: str) -> Path:
        return settings.runs_dir / f"{run_id}.json"

    def save(self, settings: Settings, run_id: str) -> None:
        path = self.path(settings, run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"task": self.task, "backend": self.backend}) + "\n")

    @classmethod
    def load(cls, settings: Settings, run_id: str) -> RunConfig:
        path = cls.path(settings, run_id)
        if not path.exists():
            raise NotFoundError(
                f"run {run_id} has no server configuration in this home",
                hint="operate on a run from the home that opened it",
            )
        data = json.loads(path.read_text())
        return cls(task=str(data["task"]), backend=data.get("backend"))


@dataclass(frozen=True)
class ServerConfig:
    """How a server is set up (not evidence).

    ``gateway``: the trials' model gateway ("auto": started on demand from the home's
    gateway.toml; None: trials get no model access); ``workers``: trials of one evaluation
    in flight at once; ``task_loader``: a task reference to its task (None: the bundled
    tasks and task folders); ``tree_limits``: the size limits of a candidate tree;
    ``default_backend``: the sandbox backend of runs opened without one (None: the
    strongest); ``executor``: an Executor (the caller's to close), or the URL of one (see
    :mod:`holedger.server.executor`; None: ``HOLEDGER_EXECUTOR``, else local).
    """

    gateway: TrialGateway | Literal["auto"] | None = "auto"
    workers: int = DEFAULT_WORKERS
    task_loader: Callable[[str], ServerTask] | None = None
    tree_limits: TreeLimits = DEFAULT_LIMITS
    default_backend: str | None = None
    executor: Executor | str | None = None


class ServerCore:
    """The server's shared parts (one per process and ledger; thread-safe)."""

    def __init__(self, settings: Settings, ledger: Ledger, config: ServerConfig) -> None:
        if config.workers < 1:
            raise UsageError("workers must be at least 1")
        gateway, executor = config.gateway, config.executor
        self.settings = settings
        self.ledger = ledger
        self.states = StateCache(ledger)
        self.workers = config.workers
        self.task_loader = config.task_loader
        self.tree_limits = config.tree_limits
        self.default_backend = config.default_backend
        # An executor given as an object is the caller's to close; one named here is ours.
        self._owned_executor = executor is None or isinstance(executor, str)
        self.executor: Executor = (
            make_executor(executor) if executor is None or isinstance(executor, str) else executor
        )
        self._gateway_choice = gateway
        self._gateway: TrialGateway | None = None if gateway == "auto" else gateway
        self._owned_gateway: Any = None
        self._tasks: dict[str, ServerTask] = {}
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}
        # Evaluations and nominations in flight, and whether new ones are refused.
        self._work_cond = threading.Condition()
        self.in_flight = 0
        self._stopping = False
        # Called with (label, done, total) as each trial ends (server/progress.py).
        self.trial_progress: ProgressHook | None = None

    # ------------------------------------------------------------------ work in flight

    @contextlib.contextmanager
    def work(self) -> Iterator[None]:
        """Count an evaluation or nomination in flight; refused once draining."""
        with self._work_cond:
            if self._stopping:
                raise Unavailable(
                    "the server is stopping: it takes no new evaluation or nomination",
                    hint="retry once it runs again",
                )
            self.in_flight += 1
        try:
            yield
        finally:
            with self._work_cond:
                self.in_flight -= 1
                self._work_cond.notify_all()

    def drain(self, timeout: float | None = None) -> int:
        """Refuse new evaluations and nominations and wait (up to ``timeout``) for those
        in flight to be recorded; returns how many still run (0: all were recorded)."""
        with self._work_cond:
            self._stopping = True
            self._work_cond.wait_for(lambda: self.in_flight == 0, timeout)
            return self.in_flight

    def close(self) -> None:
        if self._owned_gateway is not None:
            self._owned_gateway.close()
            self._owned_gateway = None
        if self._owned_executor:
            self.executor.close()

    # ------------------------------------------------------------------ plumbing

    def task(self, ref: str) -> ServerTask:
        with self._lock:
            if ref not in self._tasks:
                loader = self.task_loader or taskview.load_server_task
                self._tasks[ref] = loader(ref)
            return self._tasks[ref]

    def run_task(self, run_id: str) -> ServerTask:
        config = RunConfig.load(self.settings, run_id)
        task = self.task(config.task)
        opened = self.ledger.run_terms(run_id)
        if task.digest != opened.task_digest:
            raise PolicyError(
                f"task {task.terms.task_id} changed since run {run_id} was opened "
                f"(digest {task.digest[:12]} != {opened.task_digest[:12]})",
                hint="restore the task as it was, or open a new run",
            )
        return with_run_seed(task, opened.terms)

    def repo(self, run_id: str) -> CandidateRepo:
        return CandidateRepo(self.settings.run_repo(run_id))

    def gateway(self) -> TrialGateway | None:
        if self._gateway_choice != "auto":
            return self._gateway
        with self._lock:
            if self._gateway is None:
                from holedger.server.gateway_link import GatewayLink, gateway_config

                link = GatewayLink(self.ledger, gateway_config(self.settings))
                self._gateway = self._owned_gateway = link
            return self._gateway

    def state(self, run_id: str) -> RunState:
        return self.states.current(run_id)

    def request_lock_path(self, run_id: str, request_id: str) -> Path:
        return self.settings.runs_dir / f"{run_id}.requests" / f"{request_id}.lock"

    def nomination_lock_path(self, run_id: str) -> Path:
        return self.settings.runs_dir / f"{run_id}.nominate.lock"

    # ------------------------------------------------------------------ deciding

    def decide(self, run_id: str, decide: Callable[[RunState], tuple[Sequence[Item], T]]) -> T:
        """Fold, decide, append at the folded head; on a lost race fold and decide again.

        Deciders of one run in this process take turns (a per-run lock), so they do not
        race each other; other processes and the gateway can still append first, which
        the ledger's ``expected_seq`` check catches.
        """
        with self._run_lock(run_id):
            for _ in range(MAX_DECIDE_ATTEMPTS):
                state = self.states.current(run_id)
                items, result = decide(state)
                if not items:
                    return result
                try:
                    self.ledger.append_many(run_id, list(items), expected_seq=state.next_seq)
                    return result
                except LedgerConflictError:
                    continue  # another writer won; the ledger re-reads the run next time
        raise LedgerConflictError(f"run {run_id} is too busy to decide", hint="try again")

    def _run_lock(self, run_id: str) -> threading.Lock:
        with self._lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    def append(self, run_id: str, items: Sequence[Item]) -> None:
        """Append facts that depend on no decision (trial results), retrying on races."""
        for _ in range(MAX_DECIDE_ATTEMPTS):
            try:
                self.ledger.append_many(run_id, list(items))
                return
            except LedgerConflictError:
                continue
        raise LedgerConflictError(f"run {run_id} is too busy to append", hint="try again")

    def record_request(self, run_id: str, request_id: str, items: list[Item]) -> bool:
        """Append a request's trials and projection as a decision: only while the request
        is pending in an open run, so it is never recorded twice, whoever else tries.
        False when it was not pending (nothing appended)."""

        def decide(st: RunState) -> tuple[list[Item], bool]:
            if st.closed or request_id not in st.pending:
                return [], False
            return items, True

        return self.decide(run_id, decide)

    # ------------------------------------------------------------------ trials

    def trial_runner(self, run_id: str, task: ServerTask) -> TrialRunner:
        """Everything trials need, made (and its configuration checked) before a request
        is recorded: a backend, a gateway or a setting that fails must fail the request
        unrecorded, not leave an accepted request that never gets its trials."""
        config = RunConfig.load(self.settings, run_id)
        backend = config.backend
        if backend is None:  # runs opened before the backend was kept beside them
            backend = get_backend(None).name
        self.executor.check(backend)
        return TrialRunner(
            ledger=self.ledger,
            repo=self.repo(run_id),
            executor=self.executor,
            backend=backend,
            entrypoint=task.terms.entrypoint,
            model=task.model,
            limits=Limits(wall_s=float(task.terms.case_timeout_s)),
            verify=task.verify,
            gateway=self.gateway() if task.terms.models else None,
            timeout_score=task.terms.timeout_score,
        )

    def try_trial_runner(
        self, run_id: str, task: ServerTask
    ) -> tuple[TrialRunner | None, HoledgerError | None]:
        """The trial runner, or why it cannot be made. A decision that would run trials
        raises the error before recording anything; a refusal is recorded as usual."""
        try:
            return self.trial_runner(run_id, task), None
        except HoledgerError as exc:
            return None, exc

    def run_trials(
        self,
        runner: TrialRunner | None,
        run_id: str,
        request: EvaluationRequested,
        cases: dict[str, CaseData],
        *,
        resumed: bool = False,
    ) -> list[TrialOutcome]:
        """Run an accepted request's trials (see :mod:`holedger.server.dispatch`)."""
        assert runner is not None  # a decision to run trials needs one (try_trial_runner)
        # A resumed held-out scoring runs under new trial ids: the model calls of the
        # attempt cut short are recorded under the old ones, and must not count as the
        # new trials' calls.
        prefix = f"{request.request_id}-{uuid.uuid4().hex[:8]}" if resumed else request.request_id
        inputs = {c: cases[c].input for c in request.case_ids}
        refs = dispatch.trial_refs(run_id, request, inputs, prefix)
        return dispatch.run_trials(
            runner, refs, workers=self.workers, split=request.split, progress=self.trial_progress
        )


def open_for_search(state: RunState) -> None:
    """Refuse a search operation (commit, evaluation) on a closed or nominated run, and on
    a solve-evolve run, which changes its harness and scores cases only in its steps."""
    if state.opened.solve_evolve is not None:
        raise PolicyError(
            f"run {state.run_id} is a solve-evolve run: no search commit or evaluation",
            hint="its steps score the stream and take the evolver's commits (docs/PROTOCOL.md)",
        )
    if state.closed:
        raise PolicyError(
            f"run {state.run_id} is closed",
            hint="open a new run to search again: holedger run open --task T",
        )
    if state.nominated is not None:
        raise PolicyError(
            f"run {state.run_id} has nominated {state.nominated[:12]}; the search is over"
        )
