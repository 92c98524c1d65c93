"""Recording what a server that stopped mid-evaluation left unrecorded: ``run recover``.

An evaluation holds a lock file for its request from before the request is recorded until
its projection is (:mod:`holedger.server.locks`). An accepted dev or val request without a
projection whose lock is free was therefore left by a server that was killed (or stopped
at once) while the request's trials ran. Each of its trials is recorded as not run to its
end (score 0, a ``sandbox_error`` violation saying so, and the model calls recorded under
its trial id as its tokens), then its projection, so the run verifies again; its trial
tokens are revoked. A request whose evaluation still runs, in this process or another on
this home, holds its lock and is left alone. Every evaluation, nomination and abort of the
run does this first; held-out scoring cut short is finished by nominating again instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from holedger.errors import PolicyError, VerificationError
from holedger.replay.report import counted
from holedger.sandboxes import Limits
from holedger.schemas.events import EvaluationRequested, GatewayCall, TokenUsage
from holedger.server.core import RunConfig, ServerCore
from holedger.server.dispatch import projected, trial_items, trial_refs
from holedger.server.locks import request_lock
from holedger.server.trials import unfinished_trial

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` found: requests it recorded, requests whose evaluation still
    runs, and a nominated candidate whose held-out scoring was cut short (nominating it
    again finishes it)."""

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


def recover(core: ServerCore, run_id: str) -> Recovery:
    """Record what a stopped server left unrecorded in ``run_id`` (the module's doc)."""
    state = core.states.current(run_id)
    if state.closed and state.pending:
        raise PolicyError(
            f"run {run_id} was closed with {counted(len(state.pending), 'request')} "
            "never recorded; nothing may be added to a closed run",
            hint="replay reports the requests; open a new run",
        )
    recorded = record_left_requests(core, run_id)
    state = core.states.current(run_id)
    running = sorted(state.pending)
    unscored = state.nominated if not state.closed else None  # nominate again to close
    return Recovery(run_id, recorded, running, unscored)


def record_left_requests(core: ServerCore, run_id: str) -> list[str]:
    """Record the requests a stopped server left (see :func:`recover`); their ids."""
    recorded: list[str] = []
    for request_id in core.states.current(run_id).pending:
        with request_lock(core.request_lock_path(run_id, request_id), wait=False) as held:
            if not held:
                continue  # its evaluation is still running
            state = core.states.current(run_id)  # it may have ended meanwhile
            request = state.pending.get(request_id)
            if request is not None and not state.closed:
                if record_left(core, run_id, request):
                    recorded.append(request_id)
    return recorded


def record_left(core: ServerCore, run_id: str, request: EvaluationRequested) -> bool:
    """Record one left request's trials as not run, and its projection; False when it
    was recorded meanwhile (nothing appended)."""
    task = core.run_task(run_id)
    prefix = request.request_id
    from holedger.gateway.tokens import TokenRegistry

    # First, so no call of its trials can be made after their calls are summed.
    TokenRegistry(core.ledger.app.engine).revoke_request(run_id, request.request_id)
    calls: dict[str, list[int]] = {}
    for rec in core.ledger.records(run_id):
        if rec.type == "TrialCompleted" and rec.payload.get("request_id") == prefix:
            if prefix not in core.states.current(run_id).pending:
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
    backend = RunConfig.load(core.settings, run_id).backend or "unknown"
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
    for ref in trial_refs(run_id, request, {}, prefix):
        sums = calls.get(ref.trial_id, [0] * 6)
        tokens = TokenUsage(
            input=sums[0], cached=sums[1], output=sums[2], reasoning=sums[3], total=sums[4]
        )
        outcomes.append(unfinished_trial(backend, limits, ref, detail, tokens, sums[5], isolation))
    projection = projected(request, task.terms.disclosure, outcomes)
    items = [*trial_items(outcomes), ("DisclosureProjected", projection, "server")]
    recorded = core.record_request(run_id, request.request_id, items)
    if recorded:
        log.warning(
            "request %s of run %s was left unrecorded by an evaluation that ended (the "
            "server stopped or failed): recorded its %d trials as not run",
            request.request_id,
            run_id,
            len(outcomes),
        )
    return recorded
