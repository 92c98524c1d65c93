"""Committing a candidate: a tree on a parent, checked against the task's rules.

A candidate tree (a folder or a file map) is refused with nothing recorded when it breaks
a rule (:mod:`holedger.server.candidates`, :mod:`holedger.server.trees`); otherwise it is
recorded as CandidateCommitted with the next index, once per tree and parent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from holedger.errors import NotFoundError
from holedger.schemas.events import CandidateCommitted
from holedger.server.candidates import (
    CandidateRefused,
    FileMap,
    changed_paths,
    entrypoint_problem,
    read_directory,
)
from holedger.server.core import ServerCore, open_for_search
from holedger.server.dispatch import Item
from holedger.server.state import RunState
from holedger.server.trees import immutable_refusal


@dataclass(frozen=True)
class CommittedCandidate:
    candidate: str
    index: int
    tree: str
    parent: str | None
    changed_paths: list[str]
    created: bool  # False when the same tree and parent were committed before


def commit_candidate(
    core: ServerCore, run_id: str, source: Path | FileMap, parent: str | None = None
) -> CommittedCandidate:
    """Commit a candidate tree; refuse it with nothing recorded when it breaks a rule."""
    state = core.states.current(run_id)
    open_for_search(state)
    task = core.run_task(run_id)
    files = read_directory(source, core.tree_limits) if isinstance(source, Path) else source
    problem = entrypoint_problem(files, task.terms.entrypoint)
    if problem:
        raise CandidateRefused(problem, hint="keep the task's entrypoint module")
    parent_id = state.seed_commit
    if parent is not None:
        resolved = state.resolve_candidate(parent)
        if resolved is None:
            raise NotFoundError(f"no committed candidate {parent} in run {run_id}")
        parent_id = resolved
    repo = core.repo(run_id)
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

    result = core.decide(run_id, decide)
    repo.keep(result.candidate)
    return result
