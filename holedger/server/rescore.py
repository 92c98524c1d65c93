"""`holedger rescore RUN --times N`: the trusted server scores a closed run's nominee again
on the test split, N times, outside that run's budget.

Each re-scoring is a run of its own (docs/PROTOCOL.md, "Re-scoring a nominee"): opened with
the label ``rescore`` and ``RunOpened.rescore_of`` naming the run, its nominee's commit and
tree and the re-scoring's index; the nominee's files committed (the same tree); nominated
at once and held-out scored with K attempts per test case like any run, then closed. The
run re-scored is never written to. Indices continue from the run's earlier re-scorings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from holedger.errors import PolicyError, UsageError
from holedger.protocol.rules import BASELINE_OPTIMIZER, RESCORE_OPTIMIZER
from holedger.schemas.canonical import rational_to_str
from holedger.schemas.events import RescoreOf
from holedger.server.core import RunConfig
from holedger.server.service import RunService

MAX_TIMES = 100


@dataclass(frozen=True)
class Rescored:
    """One re-scoring run, closed and scored."""

    run_id: str
    index: int
    e_h_plus: Any
    e_h_plus_se: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "index": self.index,
            "e_h_plus": rational_to_str(self.e_h_plus),
            "e_h_plus_se": self.e_h_plus_se,
        }


def earlier_rescorings(service: RunService, run_id: str) -> int:
    """The highest index of ``run_id``'s re-scorings in this ledger (0: none)."""
    done = 0
    for info in service.ledger.runs():
        if info.optimizer != RESCORE_OPTIMIZER:
            continue
        of = service.ledger.run_terms(info.run_id).rescore_of
        if of is not None and of.run_id == run_id:
            done = max(done, of.index)
    return done


def rescore(
    service: RunService,
    run: str,
    times: int,
    *,
    progress: Callable[[Rescored], None] | None = None,
    start: Callable[[str], None] | None = None,
) -> list[Rescored]:
    """Re-score ``run``'s nominee ``times`` times; each a closed, scored run of its own.
    ``start`` is told the run id once every check has passed (nothing is said before a
    refusal)."""
    if not 1 <= times <= MAX_TIMES:
        raise UsageError(f"--times {times} is not from 1 to {MAX_TIMES}", hint="e.g. --times 2")
    run_id = service.ledger.resolve_run(run)
    state = service.state(run_id)
    opened = state.opened
    if opened.rescore_of is not None:
        raise UsageError(
            f"run {run_id} is itself a re-scoring (of run {opened.rescore_of.run_id})",
            hint=f"re-score the run it re-scores: holedger rescore {opened.rescore_of.run_id}",
        )
    if opened.optimizer == BASELINE_OPTIMIZER:
        raise UsageError(
            f"run {run_id} is a task's seed-baseline run", hint="re-score a run of an optimizer"
        )
    if not state.closed or state.scored is None or state.closed_reason == "aborted":
        raise UsageError(
            f"run {run_id} is not closed with a held-out score "
            f"({state.closed_reason or 'still open'})",
            hint="only a nominated, scored and closed run's nominee is re-scored",
        )
    nominee = state.scored.candidate
    tree = state.candidates[nominee].tree
    config = RunConfig.load(service.settings, run_id)
    files = service.repo(run_id).files(nominee)
    out: list[Rescored] = []
    if start is not None:
        start(run_id)
    first = earlier_rescorings(service, run_id) + 1
    for index in range(first, first + times):
        bound = RescoreOf(run_id=run_id, candidate=nominee, tree=tree, index=index)
        new = service.open_run(
            config.task,
            optimizer=RESCORE_OPTIMIZER,
            backend=config.backend,
            rescore_of=bound,
            seed_variant=opened.terms.seed_variant,  # the same seed, so the same E(H0)
        )
        committed = service.commit_candidate(new.run_id, files, None)
        if committed.tree != tree:  # the same files make the same tree: never, unless broken
            raise PolicyError(f"the nominee's files of run {run_id} commit to another tree")
        scored = service.nominate(new.run_id, committed.candidate)
        done = Rescored(new.run_id, index, scored.e_h_plus, scored.e_h_plus_se)
        out.append(done)
        if progress is not None:
            progress(done)
    return out
