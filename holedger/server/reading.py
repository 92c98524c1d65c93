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


def projections(core: ServerCore, run_id: str) -> dict[str, Any]:
    """The run's projections, in the order they were recorded: request id and digest."""
    state = core.states.current(run_id)
    order = sorted(state.projected_at, key=lambda r: state.projected_at[r])
    return {
        "run_id": run_id,
        "evaluations": [
            {"request_id": r, "projection_digest": state.projections[r]} for r in order
        ],
    }


def projection(core: ServerCore, run_id: str, request_id: str) -> dict[str, Any]:
    """One projection the optimizer was shown, as recorded; else NotFound."""
    seq = core.states.current(run_id).projected_at.get(request_id)
    if seq is None:
        raise NotFoundError(f"no projection of request {request_id!r} in run {run_id}")
    rec = next(core.ledger.records(run_id, after_seq=seq - 1))
    keep = ("request_id", "split", "policy", "projection", "projection_digest")
    return {k: rec.payload[k] for k in keep}


def candidate_info(core: ServerCore, run_id: str, ref: str) -> CandidateInfo:
    state = core.states.current(run_id)
    commit = state.resolve_candidate(ref)
    if commit is None:
        raise NotFoundError(f"no committed candidate {ref!r} in run {run_id}")
    return state.candidates[commit]
