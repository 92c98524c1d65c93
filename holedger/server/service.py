"""The trusted server's operations: open a run, commit, evaluate, nominate and score.

Every operation follows one pattern: fold the run's events into its current state
(:class:`~holedger.server.state.StateCache`), decide with the pure rules
(:mod:`holedger.protocol.rules`), and append the decision with ``expected_seq`` = the head
it was decided on. When another writer (a thread, a process, the gateway) appended first,
the ledger raises LedgerConflictError and the operation folds again and decides again, so
the budget gate is atomic without any lock outside the ledger.

Run lifecycle: RunOpened (task terms, task digest, pinned seed baseline), the seed as
CandidateCommitted index 0, then any number of CandidateCommitted and EvaluationRequested
(each accepted request followed by its TrialCompleted, SafetyViolation and one
DisclosureProjected), then CandidateNominated, the held-out EvaluationRequested on the
test split (K attempts per test case, outside the search budget) with its trials,
RunScored and RunClosed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from holedger.config import Settings
from holedger.errors import (
    BudgetExceededError,
    HoledgerError,
    LedgerConflictError,
    NotFoundError,
    PolicyError,
    Unavailable,
    UsageError,
    VerificationError,
)
from holedger.ledger.store import Ledger
from holedger.protocol import refusals, rules
from holedger.protocol.runs import new_run_id
from holedger.replay.report import counted
from holedger.sandboxes import Backend, Limits, get_backend
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import (
    CandidateCommitted,
    CandidateNominated,
    CaseScores,
    DisclosurePolicy,
    DisclosureProjected,
    EvaluationRequested,
    GatewayCall,
    OptimizerDescriptor,
    RunScored,
    SeedBaseline,
    TokenUsage,
)
from holedger.schemas.types import Role
from holedger.server import MAX_ATTEMPTS, taskview
from holedger.server.budget_view import budget_json
from holedger.server.candidates import (
    DEFAULT_LIMITS,
    CandidateRefused,
    CandidateRepo,
    FileMap,
    TreeLimits,
    changed_paths,
    entrypoint_problem,
    read_directory,
)
from holedger.server.locks import nomination_lock, request_lock
from holedger.server.progress import ProgressHook, trial_counter
from holedger.server.state import CandidateInfo, RunState, StateCache
from holedger.server.taskview import CaseData, ServerTask
from holedger.server.trees import immutable_refusal
from holedger.server.trials import (
    TrialGateway,
    TrialOutcome,
    TrialPlan,
    TrialRunner,
    outcome_warnings,
    unfinished_trial,
)

log = logging.getLogger(__name__)


class EvaluationInterrupted(KeyboardInterrupt):
    """An interrupt while a request's trials ran, with every trial's outcome: those that
    ran, and the rest as not run. An evaluation records them and its projection, then
    interrupts; held-out scoring records nothing (nominating again finishes it)."""

    def __init__(self, outcomes: list[TrialOutcome]) -> None:
        super().__init__("interrupted")
        self.outcomes = outcomes


DEFAULT_WORKERS = 2
MAX_DECIDE_ATTEMPTS = 200
T = TypeVar("T")
Item = tuple[str, BaseModel, Role]


@dataclass(frozen=True)
class OpenedRun:
    run_id: str
    task_id: str
    seed_commit: str
    optimizer_token: str
    seed_baseline: SeedBaseline | None
    backend: str


@dataclass(frozen=True)
class CommittedCandidate:
    candidate: str
    index: int
    tree: str
    parent: str | None
    changed_paths: list[str]
    created: bool  # False when the same tree and parent were committed before


@dataclass(frozen=True)
class Evaluation:
    request_id: str
    candidate: str
    split: str
    policy: str
    projection: dict[str, Any]
    projection_digest: str
    cost: dict[str, Any]
    budget_after: dict[str, Any]
    # What went wrong in dev trials (trials.outcome_warnings), for the command line; empty
    # when nothing did, and always for val, which discloses its aggregate mean only. Not
    # in the API's answer, which is the recorded projection and the budget, nothing more.
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The evaluation as the API and ``holedger eval --json`` give it."""
        return {
            "request_id": self.request_id,
            "candidate": self.candidate,
            "split": self.split,
            "policy": self.policy,
            "projection": self.projection,
            "projection_digest": self.projection_digest,
            "cost": self.cost,
            "budget_used": self.budget_after,
        }


@dataclass(frozen=True)
class Recovery:
    """What :meth:`RunService.recover` found: requests it recorded, requests whose
    evaluation still runs, and a nominated candidate whose held-out scoring was cut short
    (nominating it again finishes it)."""

    run_id: str
    recorded: list[str]
    running: list[str]
    unscored_nomination: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "recorded": self.recorded,
            "running": self.running,
            "unscored_nomination": self.unscored_nomination,
        }


@dataclass(frozen=True)
class ScoredRun:
    run_id: str
    candidate: str
    k: int
    e_h_plus: Fraction
    e_h0: Fraction
    g: Fraction | None
    per_case: dict[str, list[Fraction]]

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "candidate": self.candidate,
            "k": self.k,
            "e_h_plus": rational_to_str(self.e_h_plus),
            "e_h0": rational_to_str(self.e_h0),
            "g": None if self.g is None else rational_to_str(self.g),
            "per_case": {c: [rational_to_str(s) for s in v] for c, v in self.per_case.items()},
        }


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


class RunService:
    """The server's Python API. Thread-safe; one per process and ledger."""

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        *,
        gateway: TrialGateway | Literal["auto"] | None = "auto",
        workers: int = DEFAULT_WORKERS,
        task_loader: Callable[[str], ServerTask] | None = None,
        tree_limits: TreeLimits = DEFAULT_LIMITS,
        default_backend: str | None = None,
    ) -> None:
        if workers < 1:
            raise UsageError("workers must be at least 1")
        self.settings = settings
        self.ledger = ledger
        self.states = StateCache(ledger)
        self.workers = workers
        self.task_loader = task_loader
        self.tree_limits = tree_limits
        self.default_backend = default_backend
        self._gateway_choice = gateway
        self._gateway: TrialGateway | None = None if gateway == "auto" else gateway
        self._owned_gateway: Any = None
        self._tasks: dict[str, ServerTask] = {}
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}
        # Evaluations and nominations in flight, and whether new ones are refused.
        self._work_cond = threading.Condition()
        self._in_flight = 0
        self._stopping = False
        # Called with (label, done, total) as each trial ends (server/progress.py).
        self.trial_progress: ProgressHook | None = None

    @property
    def in_flight(self) -> int:
        """Evaluations and nominations now running."""
        return self._in_flight

    @contextlib.contextmanager
    def _work(self) -> Iterator[None]:
        with self._work_cond:
            if self._stopping:
                raise Unavailable(
                    "the server is stopping: it takes no new evaluation or nomination",
                    hint="retry once it runs again",
                )
            self._in_flight += 1
        try:
            yield
        finally:
            with self._work_cond:
                self._in_flight -= 1
                self._work_cond.notify_all()

    def drain(self, timeout: float | None = None) -> int:
        """Refuse new evaluations and nominations and wait (up to ``timeout``) for those
        in flight to be recorded; returns how many still run (0: all were recorded). A
        server stopped without draining leaves an accepted request without its trials."""
        with self._work_cond:
            self._stopping = True
            self._work_cond.wait_for(lambda: self._in_flight == 0, timeout)
            return self._in_flight

    def close(self) -> None:
        if self._owned_gateway is not None:
            self._owned_gateway.close()
            self._owned_gateway = None

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
        return task

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

    def _decide(self, run_id: str, decide: Callable[[RunState], tuple[Sequence[Item], T]]) -> T:
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

    def _append(self, run_id: str, items: Sequence[Item]) -> None:
        """Append facts that depend on no decision (trial results), retrying on races."""
        for _ in range(MAX_DECIDE_ATTEMPTS):
            try:
                self.ledger.append_many(run_id, list(items))
                return
            except LedgerConflictError:
                continue
        raise LedgerConflictError(f"run {run_id} is too busy to append", hint="try again")

    # ------------------------------------------------------------------ open

    def open_run(
        self,
        task_ref: str,
        *,
        optimizer: str = "unnamed",
        backend: str | None = None,
        baseline: bool = True,
        descriptor: OptimizerDescriptor | None = None,
    ) -> OpenedRun:
        """RunOpened pinning the task and its seed baseline; the seed as candidate 0."""
        if not optimizer or len(optimizer) > 200 or not optimizer.isprintable():
            # Checked before anything is made: the label is recorded as text in RunOpened.
            raise UsageError(
                f"optimizer label {optimizer[:80]!r} is not a printable name of 1 to 200 "
                "characters",
                hint="name the optimizer with plain text, e.g. --optimizer my-search",
            )
        if Path(task_ref).is_dir():
            task_ref = str(Path(task_ref).resolve())  # later commands may run elsewhere
        task = self.task(task_ref)
        # Refuse an unavailable backend before anything is recorded; without one named,
        # the strongest available now is the run's for good (its trials never switch).
        backend = get_backend(backend or self.default_backend).name
        seed_files = read_directory(task.seed_dir, self.tree_limits)
        seed_baseline = self.ensure_baseline(task_ref, backend=backend) if baseline else None
        run_id = new_run_id()
        repo = self.repo(run_id)
        seed = repo.commit(seed_files, None)
        if seed.commit != task.terms.seed_commit:
            raise PolicyError(
                f"the seed folder of task {task.terms.task_id} commits to {seed.commit[:12]}, "
                f"not the pinned {task.terms.seed_commit[:12]}",
                hint="run 'holedger tasks verify' on the task",
            )
        problem = entrypoint_problem(seed_files, task.terms.entrypoint)
        if problem:
            raise PolicyError(f"seed harness of {task.terms.task_id}: {problem}")
        RunConfig(task_ref, backend).save(self.settings, run_id)
        self.ledger.open_run(
            task.terms,
            task_digest=task.digest,
            optimizer=optimizer,
            seed_baseline=seed_baseline,
            run_id=run_id,
            descriptor=descriptor,
        )
        committed = CandidateCommitted(
            candidate=seed.commit,
            index=0,
            tree=seed.tree,
            parent=None,
            changed_paths=sorted(seed_files),
            immutable_ok=True,
        )
        self._append(run_id, [("CandidateCommitted", committed, "server")])
        from holedger.gateway.tokens import TokenRegistry

        token = TokenRegistry(self.ledger.app.engine).issue_optimizer_token(run_id)
        return OpenedRun(run_id, task.terms.task_id, seed.commit, token, seed_baseline, backend)

    # ------------------------------------------------------------------ commit

    def commit_candidate(
        self, run_id: str, source: Path | FileMap, parent: str | None = None
    ) -> CommittedCandidate:
        """Commit a candidate tree (a folder or a file map); refuse it with nothing recorded
        when it breaks a rule (see :mod:`holedger.server.candidates`)."""
        state = self.states.current(run_id)
        _open_for_search(state)
        task = self.run_task(run_id)
        files = read_directory(source, self.tree_limits) if isinstance(source, Path) else source
        problem = entrypoint_problem(files, task.terms.entrypoint)
        if problem:
            raise CandidateRefused(problem, hint="keep the task's entrypoint module")
        parent_id = state.seed_commit
        if parent is not None:
            resolved = state.resolve_candidate(parent)
            if resolved is None:
                raise NotFoundError(f"no committed candidate {parent} in run {run_id}")
            parent_id = resolved
        repo = self.repo(run_id)
        seed_listing = repo.listing(state.seed_commit)
        # Build the tree in the object store (unreferenced until accepted) to compare it.
        commit = repo.commit(files, parent_id, keep=False)
        listing = repo.listing(commit.commit)
        refusal = immutable_refusal(seed_listing, listing, task.terms.immutable_paths)
        if refusal is not None:
            raise refusal
        changed = changed_paths(repo.listing(parent_id), listing)

        def decide(st: RunState) -> tuple[list[Item], CommittedCandidate]:
            known = st.candidates.get(commit.commit)
            if known is not None:
                return [], CommittedCandidate(
                    known.commit, known.index, known.tree, known.parent, changed, False
                )
            payload = CandidateCommitted(
                candidate=commit.commit,
                index=len(st.candidates),
                tree=commit.tree,
                parent=parent_id,
                changed_paths=changed,
                immutable_ok=True,
            )
            result = CommittedCandidate(
                commit.commit, payload.index, commit.tree, parent_id, changed, True
            )
            return [("CandidateCommitted", payload, "server")], result

        result = self._decide(run_id, decide)
        repo.keep(result.candidate)
        return result

    # ------------------------------------------------------------------ evaluate

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
        with self._work():
            return self._evaluate(run_id, candidate, split, case_ids, attempts)

    def _evaluate(
        self,
        run_id: str,
        candidate: str,
        split: str,
        case_ids: Sequence[str] | None,
        attempts: int,
    ) -> Evaluation:
        if split not in ("dev", "val", "test"):
            raise UsageError(f"unknown split {split!r}", hint="use dev or val")
        if attempts < 1:
            raise UsageError(
                f"attempts must be at least 1, got {attempts}",
                hint="ask for one attempt per case or more",
            )
        if attempts > MAX_ATTEMPTS:
            # Not recorded: no budget holds that many, and its record would cost every
            # replay of the run (or, past 2**53, could not be written at all).
            raise UsageError(
                f"attempts must be at most {MAX_ATTEMPTS}, got {attempts}",
                hint="ask for fewer attempts; the budget counts each one",
            )
        state = self.states.current(run_id)
        _open_for_search(state)
        commit = state.resolve_candidate(candidate)
        if commit is None:
            raise NotFoundError(
                f"no committed candidate {candidate!r} in run {run_id}",
                hint="commit it first, or give 'seed' or a unique commit prefix",
            )
        task = self.run_task(run_id)
        terms = task.terms
        split_cases = {c.id: c for c in task.cases(split)}
        ids = list(case_ids) if case_ids else list(split_cases)
        unknown = sorted(set(ids) - set(split_cases))
        if unknown:
            # Not recorded: replay cannot re-check membership without the task's case list,
            # so a request naming unknown cases is malformed, not a protocol decision.
            raise NotFoundError(
                f"case {unknown[0]!r} is not in the {split} split",
                hint="GET the run for the dev and val case ids",
            )
        request_id = f"req-{uuid.uuid4().hex[:16]}"
        cost = rules.request_cost(terms.split_sizes[split], len(ids), attempts)  # type: ignore[index]

        def decide(st: RunState) -> tuple[list[Item], EvaluationRequested]:
            if st.closed or st.nominated is not None:
                raise PolicyError(f"run {run_id} has a nomination; no more search requests")
            refusal = rules.request_problem(
                terms, split, ids, attempts, nominated=False, known_cases=None
            ) or rules.budget_decision(terms.budget, st.used, split, cost)
            if refusal is None and setup_error is not None:
                raise setup_error  # nothing recorded: the request could not get its trials
            payload = EvaluationRequested(
                request_id=request_id,
                candidate=commit,
                split=split,
                case_ids=ids,
                attempts=attempts,
                cost=cost,
                budget_before=st.used,
                decision="rejected" if refusal else "accepted",
                reason=refusal.text if refusal else None,
                code=refusal.code if refusal else None,
            )
            return [("EvaluationRequested", payload, "server")], payload

        self._recover(run_id)  # a request a stopped server left is recorded first
        runner, setup_error = self._try_trial_runner(run_id, task)
        # Held from before the request is recorded until its projection is: a request
        # without a projection whose lock is free was left by a server that stopped.
        with request_lock(self._request_lock_path(run_id, request_id)):
            request = self._decide(run_id, decide)
            if request.decision == "rejected":
                code = request.code or ""
                error = BudgetExceededError if code.startswith("budget.") else PolicyError
                raise error(
                    f"request {request_id} rejected: {request.reason or 'rejected'}",
                    hint=_hint_for(code),
                )
            interrupted: EvaluationInterrupted | None = None
            try:
                outcomes = self._run_trials(runner, run_id, request, split_cases)
            except EvaluationInterrupted as exc:  # record the request whole, then stop
                interrupted, outcomes = exc, exc.outcomes
            projected = _projected(request, terms.disclosure, outcomes)
            items = [*_trial_items(outcomes), ("DisclosureProjected", projected, "server")]
            if not self._record_request(run_id, request_id, items):
                raise PolicyError(  # cannot happen while the request's lock is held
                    f"request {request_id} of run {run_id} can no longer be recorded: the run "
                    "was closed, or another process recorded it",
                    hint="replay the run to see what it holds",
                )
            if interrupted is not None:
                raise interrupted
            after = rules.add_use(request.budget_before, split, cost)
            return Evaluation(
                request_id=request_id,
                candidate=commit,
                split=split,
                policy=projected.policy,
                projection=projected.projection,
                projection_digest=projected.projection_digest,
                cost=cost.model_dump(mode="json"),
                budget_after=after.model_dump(mode="json"),
                warnings=outcome_warnings(outcomes) if split == "dev" else [],
            )

    def _trial_runner(self, run_id: str, task: ServerTask) -> TrialRunner:
        """Everything trials need, made (and its configuration checked) before a request
        is recorded: a backend, a gateway or a setting that fails must fail the request
        unrecorded, not leave an accepted request that never gets its trials."""
        config = RunConfig.load(self.settings, run_id)
        return TrialRunner(
            ledger=self.ledger,
            repo=self.repo(run_id),
            backend=get_backend(config.backend),
            entrypoint=task.terms.entrypoint,
            model=task.model,
            limits=Limits(wall_s=float(task.terms.case_timeout_s)),
            verify=task.verify,
            gateway=self.gateway() if task.terms.models else None,
        )

    def _try_trial_runner(
        self, run_id: str, task: ServerTask
    ) -> tuple[TrialRunner | None, HoledgerError | None]:
        """The trial runner, or why it cannot be made. A decision that would run trials
        raises the error before recording anything; a refusal is recorded as usual."""
        try:
            return self._trial_runner(run_id, task), None
        except HoledgerError as exc:
            return None, exc

    def _run_trials(
        self,
        runner: TrialRunner | None,
        run_id: str,
        request: EvaluationRequested,
        cases: dict[str, CaseData],
        *,
        resumed: bool = False,
    ) -> list[TrialOutcome]:
        assert runner is not None  # a decision to run trials needs one (_try_trial_runner)
        backend = runner.backend
        # A resumed held-out scoring runs under new trial ids: the model calls of the
        # attempt cut short are recorded under the old ones, and must not count as the
        # new trials' calls.
        prefix = f"{request.request_id}-{uuid.uuid4().hex[:8]}" if resumed else request.request_id
        plans = _plans(run_id, request, {c: cases[c].input for c in request.case_ids}, prefix)
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="trial") as pool:
            futures: list[Future[TrialOutcome]] = []
            ended = trial_counter(self.trial_progress, request.split, len(plans))
            try:
                for plan in plans:
                    futures.append(pool.submit(_run_one, runner, backend, plan))
                    if ended is not None:
                        futures[-1].add_done_callback(ended)
                return [future.result() for future in futures]
            except BaseException:  # interrupted (Ctrl-C): record what ran and what did not
                not_started = sum(future.cancel() for future in futures)
                not_started += len(plans) - len(futures)
                running = sum(not future.done() for future in futures)
                log.warning(
                    "interrupted: %d trials will not run; waiting for the %d running to end "
                    "(each within the task's case timeout), then recording the request",
                    not_started,
                    running,
                )
                _wait_through_interrupts(futures)
                outcomes = [
                    future.result()
                    if future is not None and not future.cancelled() and future.exception() is None
                    else _failed_trial(
                        runner, backend, plan, "not run: the evaluation was interrupted"
                    )
                    for future, plan in itertools.zip_longest(futures, plans)
                ]
                raise EvaluationInterrupted(outcomes) from None

    # ------------------------------------------------------------------ nominate

    def nominate(self, run_id: str, candidate: str, *, wait: bool = True) -> ScoredRun:
        """Nominate once, score the candidate on every test case K times, close the run.

        A nomination cut short (the server stopped during held-out scoring, or before it
        closed the run) is finished by nominating the same candidate again: the recorded
        nomination and held-out request are reused, the trials run (they and RunScored
        are one append, so none of them was recorded), and the run is closed. Nominations
        of one run take turns, across threads and processes: one that comes while another
        scores (a client retrying a slow call) waits, then finds the run closed, so the
        held-out trials never run twice. With ``wait`` False (the HTTP API, whose threads
        are shared by every run) such a call is refused at once as Unavailable instead.
        """
        self.run_task(run_id)  # a run this home does not hold is refused before any lock
        lock = self.settings.runs_dir / f"{run_id}.nominate.lock"
        with self._work(), nomination_lock(lock, wait=wait):
            return self._nominate(run_id, candidate)

    def _nominate(self, run_id: str, candidate: str) -> ScoredRun:
        opened = self.ledger.run_terms(run_id)
        task = self.run_task(run_id)
        terms = task.terms

        def decide(st: RunState) -> tuple[list[Item], str]:
            if st.closed or (
                st.nominated is not None and st.resolve_candidate(candidate) != st.nominated
            ):
                raise PolicyError(
                    f"run {run_id} already has a nomination ({(st.nominated or '?')[:12]})",
                    hint="a run nominates exactly once",
                )
            commit = st.resolve_candidate(candidate)
            if commit is None:
                raise NotFoundError(f"no committed candidate {candidate!r} in run {run_id}")
            if st.scored is None and setup_error is not None:
                raise setup_error  # nothing recorded: held-out scoring could not run
            if st.nominated is not None:
                return [], commit  # resuming the nomination cut short
            if st.pending:  # (those a stopped server left were recorded just before)
                raise Unavailable(
                    f"run {run_id} has {counted(len(st.pending), 'evaluation')} still "
                    "running; the nomination would close the run under it",
                    hint="nominate once it is recorded",
                )
            return [("CandidateNominated", CandidateNominated(candidate=commit), "server")], commit

        self._recover(run_id)  # a search request a stopped server left, before it closes
        runner, setup_error = self._try_trial_runner(run_id, task)
        commit = self._decide(run_id, decide)
        scored_already = self.states.current(run_id).scored
        if scored_already is not None:
            return self._close_scored(run_id, scored_already)
        test_cases = {c.id: c for c in task.cases("test")}
        ids = list(test_cases)
        request_id = f"heldout-{uuid.uuid4().hex[:12]}"
        cost = rules.request_cost(terms.split_sizes["test"], len(ids), terms.k)

        resumed = False

        def held_out(st: RunState) -> tuple[list[Item], EvaluationRequested]:
            nonlocal resumed
            if st.heldout is not None:
                resumed = True
                return [], st.heldout  # resuming: its trials were never recorded
            reason = rules.request_problem(
                terms, "test", ids, terms.k, nominated=True, known_cases=set(test_cases)
            )
            if reason:
                raise PolicyError(f"held-out scoring impossible: {reason}")
            payload = EvaluationRequested(
                request_id=request_id,
                candidate=commit,
                split="test",
                case_ids=ids,
                attempts=terms.k,
                cost=cost,
                budget_before=st.used,
                decision="accepted",
            )
            return [("EvaluationRequested", payload, "server")], payload

        request = self._decide(run_id, held_out)
        outcomes = self._run_trials(runner, run_id, request, test_cases, resumed=resumed)
        per_case: dict[str, list[Fraction]] = {c: [] for c in ids}
        for outcome in sorted(outcomes, key=lambda o: (o.completed.case_id, o.completed.attempt)):
            per_case[outcome.completed.case_id].append(outcome.completed.score)
        e_plus = rules.expected_score(per_case)
        if opened.seed_baseline is not None:
            e0 = opened.seed_baseline.e_h0
        elif opened.optimizer == rules.BASELINE_OPTIMIZER:
            e0 = e_plus  # the baseline run measures E(H0) itself
        else:
            raise PolicyError(f"run {run_id} has no pinned seed baseline to score against")
        gain = rules.normalized_gain(e_plus, e0)
        scored = RunScored(
            candidate=commit,
            k=terms.k,
            per_case=[CaseScores(case_id=c, scores=s) for c, s in per_case.items()],
            e_h_plus=e_plus,
            e_h0=e0,
            g=gain,
        )
        self._append(run_id, [*_trial_items(outcomes), ("RunScored", scored, "server")])
        return self._close_scored(run_id, scored)

    def _close_scored(self, run_id: str, scored: RunScored) -> ScoredRun:
        per_case = {c.case_id: list(c.scores) for c in scored.per_case}
        result = ScoredRun(
            run_id, scored.candidate, scored.k, scored.e_h_plus, scored.e_h0, scored.g, per_case
        )
        summary = {k: v for k, v in result.as_json().items() if k != "per_case"}
        for _ in range(MAX_DECIDE_ATTEMPTS):
            try:
                self.ledger.close_run(run_id, "completed", summary)
                break
            except LedgerConflictError:
                continue
        return result

    # ------------------------------------------------------------------ recover

    def recover(self, run_id: str) -> Recovery:
        """Record what a server that stopped mid-evaluation left unrecorded in ``run_id``.

        An evaluation holds a lock file for its request from before the request is
        recorded until its projection is. An accepted dev or val request without a
        projection whose lock is free was therefore left by a server that was killed (or
        stopped at once) while the request's trials ran. Each of its trials is recorded as
        not run to its end (score 0, a ``sandbox_error`` violation saying so, and the model
        calls recorded under its trial id as its tokens), then its projection, so the run
        verifies again; its trial tokens are revoked. A request whose evaluation still
        runs, in this process or another on this home, holds its lock and is left alone.
        Every evaluation and nomination of the run does this first; held-out scoring cut
        short is finished by nominating again instead.
        """
        state = self.states.current(run_id)
        if state.closed and state.pending:
            raise PolicyError(
                f"run {run_id} was closed with {counted(len(state.pending), 'request')} "
                "never recorded; nothing may be added to a closed run",
                hint="replay reports the requests; open a new run",
            )
        recorded = self._recover(run_id)
        state = self.states.current(run_id)
        running = sorted(state.pending)
        unscored = state.nominated if not state.closed else None  # nominate again to close
        return Recovery(run_id, recorded, running, unscored)

    def _recover(self, run_id: str) -> list[str]:
        """Record the requests left by a stopped server (see :meth:`recover`); their ids."""
        recorded: list[str] = []
        for request_id in self.states.current(run_id).pending:
            path = self._request_lock_path(run_id, request_id)
            with request_lock(path, wait=False) as held:
                if not held:
                    continue  # its evaluation is still running
                state = self.states.current(run_id)  # it may have ended meanwhile
                request = state.pending.get(request_id)
                if request is not None and not state.closed:
                    if self._record_left(run_id, request):
                        recorded.append(request_id)
        return recorded

    def _record_left(self, run_id: str, request: EvaluationRequested) -> bool:
        task = self.run_task(run_id)
        prefix = request.request_id
        from holedger.gateway.tokens import TokenRegistry

        # First, so no call of its trials can be made after their calls are summed.
        TokenRegistry(self.ledger.app.engine).revoke_request(run_id, request.request_id)
        calls: dict[str, list[int]] = {}
        for rec in self.ledger.records(run_id):
            if rec.type == "TrialCompleted" and rec.payload.get("request_id") == prefix:
                if prefix not in self.states.current(run_id).pending:
                    return False  # recorded meanwhile, trials and projection together
                raise VerificationError(
                    f"request {prefix} of run {run_id} has trials recorded but no projection",
                    hint="replay the run: it reports what is missing",
                )
            if rec.type == "GatewayCall" and str(rec.payload.get("trial_id")).startswith(prefix):
                call = GatewayCall.model_validate(rec.payload)
                t = call.tokens
                sums = calls.setdefault(str(call.trial_id), [0] * 6)
                for k, value in enumerate((t.input, t.cached, t.output, t.reasoning, t.total, 1)):
                    sums[k] += value
        backend = RunConfig.load(self.settings, run_id).backend or "unknown"
        # Whatever of a trial ran, ran in the run's backend.
        isolation: Literal["isolated", "none"] = (
            "isolated" if backend in ("bwrap", "docker") else "none"
        )
        limits = Limits(wall_s=float(task.terms.case_timeout_s)).as_record()
        detail = (
            "not recorded: the evaluation of its request ended before recording it "
            "(the server stopped or failed)"
        )
        outcomes = []
        for plan in _plans(run_id, request, {}, prefix):
            sums = calls.get(plan.trial_id, [0] * 6)
            tokens = TokenUsage(
                input=sums[0], cached=sums[1], output=sums[2], reasoning=sums[3], total=sums[4]
            )
            outcomes.append(
                unfinished_trial(backend, limits, plan, detail, tokens, sums[5], isolation)
            )
        projected = _projected(request, task.terms.disclosure, outcomes)
        items = [*_trial_items(outcomes), ("DisclosureProjected", projected, "server")]
        recorded = self._record_request(run_id, request.request_id, items)
        if recorded:
            log.warning(
                "request %s of run %s was left unrecorded by an evaluation that ended (the "
                "server stopped or failed): recorded its %d trials as not run",
                request.request_id,
                run_id,
                len(outcomes),
            )
        return recorded

    def _record_request(self, run_id: str, request_id: str, items: list[Item]) -> bool:
        """Append a request's trials and projection as a decision: only while the request
        is pending in an open run, so it is never recorded twice, whoever else tries.
        False when it was not pending (nothing appended)."""

        def decide(st: RunState) -> tuple[list[Item], bool]:
            if st.closed or request_id not in st.pending:
                return [], False
            return items, True

        return self._decide(run_id, decide)

    def _request_lock_path(self, run_id: str, request_id: str) -> Path:
        return self.settings.runs_dir / f"{run_id}.requests" / f"{request_id}.lock"

    # ------------------------------------------------------------------ baseline

    def baseline_path(self, task: ServerTask) -> Path:
        return self.settings.home / "baselines" / f"{task.digest}.json"

    def ensure_baseline(self, task_ref: str, *, backend: str | None = None) -> SeedBaseline:
        """The task's pinned E(H0): read from the home and re-checked against its baseline
        run in the ledger, or computed once by a baseline run of its own."""
        task = self.task(task_ref)
        path = self.baseline_path(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        with nomination_lock(path.with_suffix(".lock")):
            known = self._read_baseline(task, path)
            if known is not None:
                return known
            # The baseline run under way is named in a file of its own until it is
            # scored, so one cut short (an interrupt during its held-out scoring) is
            # finished by the next call instead of being left behind for a new one.
            pending = path.with_suffix(".pending")
            run_id = self._pending_baseline_run(task, pending)
            if run_id is None:
                run_id = self.open_run(
                    task_ref, optimizer=rules.BASELINE_OPTIMIZER, backend=backend, baseline=False
                ).run_id
                pending.write_text(run_id + "\n")
            if not self.states.current(run_id).closed:
                self.nominate(run_id, "seed")  # finishes a nomination cut short, too
            scored = self.states.current(run_id).scored
            assert scored is not None  # a pending run is closed only once scored
            baseline = SeedBaseline(
                e_h0=scored.e_h_plus,
                k=scored.k,
                baseline_run_id=run_id,
                per_case_digest=rules.per_case_digest(
                    (c.case_id, c.scores) for c in scored.per_case
                ),
            )
            record = {"task_digest": task.digest, **baseline.model_dump(mode="json")}
            path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            pending.unlink(missing_ok=True)
            return baseline

    def _pending_baseline_run(self, task: ServerTask, pending: Path) -> str | None:
        """The baseline run of ``task`` a call cut short left (named in ``pending``), when
        it is still of this task and can be finished; else None."""
        if not pending.exists():
            return None
        run_id = pending.read_text().strip()
        try:
            if not self.ledger.has_run(run_id):
                return None
            opened = self.ledger.run_terms(run_id)
            config = RunConfig.load(self.settings, run_id)
        except (HoledgerError, ValueError):
            return None
        if opened.task_digest != task.digest or opened.optimizer != rules.BASELINE_OPTIMIZER:
            return None
        try:
            get_backend(config.backend)
        except HoledgerError as exc:
            log.warning(
                "the baseline run %s cut short cannot be finished (%s): starting another",
                run_id,
                exc.one_line(),
            )
            return None
        state = self.states.current(run_id)
        if state.closed and state.scored is None:
            return None  # closed without a score (aborted): start again
        return run_id

    def _read_baseline(self, task: ServerTask, path: Path) -> SeedBaseline | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data.pop("task_digest", None)
        baseline = SeedBaseline.model_validate(data)
        run_id = baseline.baseline_run_id
        if run_id is None or not self.ledger.has_run(run_id):
            return None
        opened = self.ledger.run_terms(run_id)
        if opened.task_digest != task.digest:
            return None
        for rec in self.ledger.records(run_id):
            if rec.type == "RunScored":
                scored = RunScored.model_validate(rec.payload)
                ok = scored.e_h_plus == baseline.e_h0 and scored.k == baseline.k
                return baseline if ok else None
        return None

    # ------------------------------------------------------------------ reading

    def run_info(self, run_id: str) -> dict[str, Any]:
        """What the optimizer may know about its run (no test data)."""
        state = self.states.current(run_id)
        task = self.run_task(run_id)
        terms = task.terms
        dev = task.cases("dev")
        val = task.cases("val")
        budget = budget_json(state, terms)
        return {
            "run_id": run_id,
            "task_id": terms.task_id,
            "model": task.model,
            "entrypoint": terms.entrypoint,
            "immutable_paths": terms.immutable_paths,
            "state": "closed" if state.closed else "nominated" if state.nominated else "open",
            "seed": state.seed_commit,
            "dev": {"case_ids": [c.id for c in dev], "inputs": {c.id: c.input for c in dev}},
            "val": {"case_ids": [c.id for c in val]},
            "split_sizes": {"dev": len(dev), "val": len(val)},
            "disclosure": terms.disclosure.model_dump(mode="json"),
            "budget": budget["limit"],
            "budget_used": budget["used"],
            "budget_remaining": budget["remaining"],
            "budget_components": budget["components"],
            "candidates": [
                {"candidate": c.commit, "index": c.index, "parent": c.parent}
                for c in sorted(state.candidates.values(), key=lambda c: c.index)
            ],
            "nominated": state.nominated,
        }

    def disclosed_blob(self, run_id: str, digest: str) -> bytes:
        """A blob this run's optimizer was shown (by digest in a projection); else NotFound."""
        state = self.states.current(run_id)
        if digest not in state.disclosed:
            raise NotFoundError(f"no disclosed blob {digest[:16]} in run {run_id}")
        return self.ledger.get_blob(digest)

    def candidate_info(self, run_id: str, ref: str) -> CandidateInfo:
        state = self.states.current(run_id)
        commit = state.resolve_candidate(ref)
        if commit is None:
            raise NotFoundError(f"no committed candidate {ref!r} in run {run_id}")
        return state.candidates[commit]


# --------------------------------------------------------------------------- helpers


def _open_for_search(state: RunState) -> None:
    if state.closed:
        raise PolicyError(
            f"run {state.run_id} is closed",
            hint="open a new run to search again: holedger run open --task T",
        )
    if state.nominated is not None:
        raise PolicyError(
            f"run {state.run_id} has nominated {state.nominated[:12]}; the search is over"
        )


def _hint_for(code: str) -> str:
    if code.startswith("budget."):
        return "see the remaining budget with 'holedger run show RUN' or GET /v1/runs/RUN/budget"
    if code == refusals.TEST_SEALED:
        return "the test split is only scored after 'holedger nominate'"
    return "fix the request"


def _run_one(runner: TrialRunner, backend: Backend, plan: TrialPlan) -> TrialOutcome:
    """Run one trial; a sandbox failure is recorded as a failed trial, never lost."""
    try:
        return runner.run(plan)
    except HoledgerError as exc:
        detail = exc.one_line()
    except Exception as exc:  # the trial must be recorded whatever broke
        detail = f"{type(exc).__name__}: {exc}"
    return _failed_trial(runner, backend, plan, detail)


def _wait_through_interrupts(futures: Sequence[Future[TrialOutcome]]) -> None:
    """Wait for the futures, a further interrupt notwithstanding: a running trial ends
    within its case timeout, and leaving before then would leave its request unrecorded."""
    while True:
        try:
            wait(futures)
            return
        except KeyboardInterrupt:
            log.warning("still waiting for the running trials to end")


def _failed_trial(
    runner: TrialRunner, backend: Backend, plan: TrialPlan, detail: str
) -> TrialOutcome:
    """A trial that did not run to its end: score 0, a sandbox_error violation saying why."""
    return unfinished_trial(backend.name, runner.limits.as_record(), plan, detail)


def _plans(
    run_id: str, request: EvaluationRequested, inputs: dict[str, Any], prefix: str
) -> list[TrialPlan]:
    """A request's trials in order (case ids, then attempts): trial ids ``prefix-NNNN``."""
    return [
        TrialPlan(
            run_id=run_id,
            request_id=request.request_id,
            trial_id=f"{prefix}-{index:04d}",
            candidate=request.candidate,
            split=request.split,
            case_id=case_id,
            attempt=attempt,
            case_input=inputs.get(case_id),
        )
        for index, (case_id, attempt) in enumerate(
            (c, a) for c in request.case_ids for a in range(request.attempts)
        )
    ]


def _projected(
    request: EvaluationRequested, policy: DisclosurePolicy, outcomes: Sequence[TrialOutcome]
) -> DisclosureProjected:
    """The DisclosureProjected of a request's trials (a dev or val request)."""
    views = [rules.trial_view(o.completed, o.answer) for o in outcomes]
    name, body = rules.project(request.split, policy, views)
    return DisclosureProjected(
        request_id=request.request_id,
        split=request.split,
        policy=name,
        projection=body,
        projection_digest=rules.projection_digest(body),
    )


def _trial_items(outcomes: Sequence[TrialOutcome]) -> list[Item]:
    items: list[Item] = []
    for outcome in outcomes:
        items.append(("TrialCompleted", outcome.completed, "server"))
        items.extend(("SafetyViolation", v, "server") for v in outcome.violations)
    return items
