"""A run's lifecycle: opening it, and finishing one that will not finish by itself.

Opening (:func:`open_run`) records RunOpened (the task terms, the task digest, the pinned
seed baseline, :mod:`holedger.server.baseline`) and the seed as CandidateCommitted index 0,
and issues the optimizer's token. A run ends with RunClosed: a nominated run closes itself
once its nominee is scored (:mod:`holedger.server.heldout`). A run whose optimizer stopped
(interrupted, crashed, gave up) would stay open for good, and an open run never verifies.
``holedger run abort`` (:func:`abort_run`) closes it without a score:

1. any dev or val request a stopped server left without trials is recorded first, as
   ``holedger run recover`` does (its trials as not run, then its projection), so every
   search request of the run is complete;
2. a held-out scoring cut short (a nomination interrupted) is left as it is: its trials
   were never recorded, and replay accepts that of an aborted run;
3. a signed RunClosed with reason ``aborted`` and, in its summary, the operator's reason
   (``why``) and no score, then the final Checkpoint.

Replay verifies an aborted run as ``verified-aborted`` ("VERIFIED (aborted)"), and the
analyses leave it out, saying so. A run with an evaluation or a nomination still running
in a live process is refused (retry once it ends, or stop that process first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from holedger.errors import NotFoundError, PolicyError, Unavailable, UsageError
from holedger.gateway.tokens import TokenRegistry
from holedger.protocol import rules
from holedger.protocol.runs import new_run_id
from holedger.replay.report import counted
from holedger.sandboxes import get_backend
from holedger.schemas.events import (
    CandidateCommitted,
    ControlOf,
    EvolveTerms,
    OptimizerDescriptor,
    RescoreOf,
    RunClosed,
    SeedBaseline,
)
from holedger.server.baseline import ensure_baseline
from holedger.server.candidates import entrypoint_problem
from holedger.server.core import RunConfig, ServerCore
from holedger.server.dispatch import Item
from holedger.server.locks import flock
from holedger.server.recovery import record_left_requests
from holedger.server.seeds import RunSeed, run_seed
from holedger.server.state import RunState

ABORTED = "aborted"
MAX_WHY_CHARS = 1000


@dataclass(frozen=True)
class OpenedRun:
    run_id: str
    task_id: str
    seed_commit: str
    optimizer_token: str
    seed_baseline: SeedBaseline | None
    backend: str


def open_run(
    core: ServerCore,
    task_ref: str,
    *,
    optimizer: str = "unnamed",
    backend: str | None = None,
    baseline: bool = True,
    descriptor: OptimizerDescriptor | None = None,
    solve_evolve: EvolveTerms | None = None,
    rescore_of: RescoreOf | None = None,
    control_of: ControlOf | None = None,
    seed_variant: str | None = None,
) -> OpenedRun:
    """RunOpened pinning the task and its seed baseline; the seed (the task's own, or its
    seed variant ``seed_variant``, :mod:`holedger.server.seeds`) as candidate 0.
    ``solve_evolve``: a solve-evolve run's terms (server/evolve.py opens those)."""
    if not optimizer or len(optimizer) > 200 or not optimizer.isprintable():
        # Checked before anything is made: the label is recorded as text in RunOpened.
        raise UsageError(
            f"optimizer label {optimizer[:80]!r} is not a printable name of 1 to 200 characters",
            hint="name the optimizer with plain text, e.g. --optimizer my-search",
        )
    if Path(task_ref).is_dir():
        task_ref = str(Path(task_ref).resolve())  # later commands may run elsewhere
    task = core.task(task_ref)
    # Refuse an unavailable backend before anything is recorded; without one named,
    # the strongest available now is the run's for good (its trials never switch).
    backend = get_backend(backend or core.default_backend).name
    start = run_seed(task, seed_variant, core.tree_limits)
    seed_files = start.files
    seed_baseline = pinned_baseline(core, task_ref, backend, start) if baseline else None
    run_id = new_run_id()
    repo = core.repo(run_id)
    seed = repo.commit(seed_files, None)
    if seed.commit != start.commit:
        raise PolicyError(
            f"the seed folder of task {task.terms.task_id} commits to {seed.commit[:12]}, "
            f"not the pinned {start.commit[:12]}",
            hint="run 'holedger tasks verify' on the task",
        )
    problem = entrypoint_problem(seed_files, task.terms.entrypoint)
    if problem:
        raise PolicyError(f"seed harness of {task.terms.task_id}: {problem}")
    RunConfig(task_ref, backend).save(core.settings, run_id)
    core.ledger.open_run(
        start.terms(task.terms),
        task_digest=task.digest,
        optimizer=optimizer,
        seed_baseline=seed_baseline,
        run_id=run_id,
        descriptor=descriptor,
        solve_evolve=solve_evolve,
        rescore_of=rescore_of,
        control_of=control_of,
    )
    committed = CandidateCommitted(
        candidate=seed.commit,
        index=0,
        tree=seed.tree,
        parent=None,
        changed_paths=sorted(seed_files),
        immutable_ok=True,
    )
    core.append(run_id, [("CandidateCommitted", committed, "server")])
    token = TokenRegistry(core.ledger.app.engine).issue_optimizer_token(run_id)
    return OpenedRun(run_id, task.terms.task_id, seed.commit, token, seed_baseline, backend)


@dataclass(frozen=True)
class AbortedRun:
    run_id: str
    why: str
    recovered: list[str]  # requests recorded as not run first
    nominated: str | None  # a nomination whose held-out scoring was cut short
    scored: bool  # the run had a RunScored (it is still left out of analyses)

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "state": ABORTED,
            "why": self.why,
            "recovered_requests": self.recovered,
            "nominated": self.nominated,
            "scored": self.scored,
        }


def pinned_baseline(
    core: ServerCore, task_ref: str, backend: str | None, seed: RunSeed | None = None
) -> SeedBaseline:
    """The seed baseline of the task (or of its seed variant ``seed``,
    :mod:`holedger.server.baseline`), measured by a baseline run opened here when the home
    has none yet."""
    variant = seed.variant if seed is not None else None

    def open_baseline_run(ref: str, in_backend: str | None) -> str:
        opened = open_run(
            core,
            ref,
            optimizer=rules.BASELINE_OPTIMIZER,
            backend=in_backend,
            baseline=False,
            seed_variant=variant,
        )
        return opened.run_id

    seed_commit = seed.commit if variant is not None and seed is not None else None
    return ensure_baseline(
        core, task_ref, open_baseline_run, backend=backend, variant=variant, seed_commit=seed_commit
    )


def check_why(why: str) -> str:
    """The operator's reason, as recorded: printable text, 1 to 1000 characters."""
    text = " ".join(why.split())
    if not text:
        raise UsageError("--reason is empty", hint="say why the run is abandoned")
    if len(text) > MAX_WHY_CHARS or not text.isprintable():
        raise UsageError(f"--reason must be printable text of at most {MAX_WHY_CHARS} characters")
    return text


class _Served(Protocol):
    """What holds the server's core: the RunService."""

    @property
    def core(self) -> ServerCore: ...


def abort_run(service: _Served | ServerCore, run_id: str, why: str) -> AbortedRun:
    """Close ``run_id`` as aborted (see the module's doc); ``service`` is the RunService."""
    core = service if isinstance(service, ServerCore) else service.core
    why = check_why(why)
    if not core.ledger.has_run(run_id):
        raise NotFoundError(f"no run {run_id}", hint="see 'holedger run list'")
    state = core.states.current(run_id)
    if state.closed:
        raise PolicyError(
            f"run {run_id} is already closed ({state.closed_reason})",
            hint="nothing is left to finish: 'holedger replay RUN' verifies it",
        )
    with flock(core.nomination_lock_path(run_id), wait=False, remove=False) as held:
        if not held:
            raise Unavailable(
                f"run {run_id}'s nomination is being scored by a live process",
                hint="let it finish (it closes the run), or stop that process and abort again",
            )
        return _abort(core, run_id, why)


def _abort(core: ServerCore, run_id: str, why: str) -> AbortedRun:
    recovered = record_left_requests(core, run_id)  # requests left without trials

    def decide(st: RunState) -> tuple[list[Item], AbortedRun]:
        if st.closed:
            raise PolicyError(f"run {run_id} is already closed ({st.closed_reason})")
        if st.pending:
            raise Unavailable(
                f"run {run_id} has {counted(len(st.pending), 'evaluation')} still running "
                f"in a live process ({', '.join(sorted(st.pending))})",
                hint="let it finish, or stop that process, then abort again",
            )
        summary = {"why": why, "nominated": st.nominated, "scored": st.scored is not None}
        closed = RunClosed(reason=ABORTED, summary=summary)
        done = AbortedRun(run_id, why, recovered, st.nominated, st.scored is not None)
        return [("RunClosed", closed, "server")], done

    return core.decide(run_id, decide)
