"""What the optimizer may read of its run: the run's terms and state (no test data),
its candidates, and the blobs it was shown."""

from __future__ import annotations

from typing import Any

from holedger.errors import NotFoundError
from holedger.server.budget_view import budget_json
from holedger.server.core import ServerCore
from holedger.server.state import CandidateInfo


def run_info(core: ServerCore, run_id: str) -> dict[str, Any]:
    """What the optimizer may know about its run (no test data)."""
    state = core.states.current(run_id)
    task = core.run_task(run_id)
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


def disclosed_blob(core: ServerCore, run_id: str, digest: str) -> bytes:
    """A blob this run's optimizer was shown (by digest in a projection); else NotFound."""
    state = core.states.current(run_id)
    if digest not in state.disclosed:
        raise NotFoundError(f"no disclosed blob {digest[:16]} in run {run_id}")
    return core.ledger.get_blob(digest)


def candidate_info(core: ServerCore, run_id: str, ref: str) -> CandidateInfo:
    state = core.states.current(run_id)
    commit = state.resolve_candidate(ref)
    if commit is None:
        raise NotFoundError(f"no committed candidate {ref!r} in run {run_id}")
    return state.candidates[commit]
