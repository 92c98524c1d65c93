"""Reserve-then-settle: each metered call reserves before it is forwarded, and is charged
what its upstream reports (or, without a report it can believe, its whole reservation).

A run's terms (allow-list, budgets, allowed server-side tools) are read once from its
RunOpened, and its settled totals from the GatewayCalls already recorded, so a gateway
that restarts goes on from where the ledger stands. Budget decisions and settlements
hand their event to the writer while holding the run's budget lock, so the ledger holds
them in decision order and replay can re-derive each decision.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from holedger.errors import NotFoundError
from holedger.gateway.budget import RunBudget
from holedger.gateway.call import Call
from holedger.gateway.call_events import CallRecorder
from holedger.gateway.denial import Denial
from holedger.gateway.optimizer_budget import OptimizerBudget, optimizer_cap, optimizer_refusal
from holedger.gateway.tokens import TokenClaims
from holedger.ledger.store import Ledger
from holedger.schemas.events import GatewayBudgetState, GatewayCall, TokenUsage
from holedger.schemas.types import exact_count


@dataclass
class RunState:
    models: frozenset[str]
    budget: RunBudget
    server_tools: frozenset[str] = frozenset()  # server-side tools the terms allow
    optimizer: OptimizerBudget = field(default_factory=lambda: OptimizerBudget(0))


class Metering:
    """Each run's terms and budgets; reserves and settles calls."""

    def __init__(self, ledger: Ledger, recorder: CallRecorder) -> None:
        self.ledger = ledger
        self.recorder = recorder
        self._runs: dict[str, RunState] = {}
        self._lock = threading.Lock()

    def run_state(self, run_id: str) -> RunState:
        state = self._runs.get(run_id)
        if state is not None:
            return state
        with self._lock:
            state = self._runs.get(run_id)
            if state is None:
                state = self._load(run_id)
                self._runs[run_id] = state
        return state

    def _load(self, run_id: str) -> RunState:
        """Terms from RunOpened; settled totals from the GatewayCalls already recorded."""
        try:
            opened = self.ledger.run_terms(run_id)
        except NotFoundError as exc:
            raise Denial(
                403, "permission_error", "unknown_run", "the token's run does not exist"
            ) from exc
        budget = opened.terms.budget
        run_budget = RunBudget(cap=budget.target_tokens, trial_cap=budget.per_trial_tokens)
        optimizer = OptimizerBudget(optimizer_cap(budget))
        for rec in self.ledger.records(run_id):
            if rec.type != "GatewayCall":
                continue
            payload = rec.typed_payload()
            assert isinstance(payload, GatewayCall)
            if payload.reservation_index is not None:
                run_budget.restore(payload.trial_id, payload.tokens.total)
            elif payload.scope == "optimizer":
                optimizer.restore(payload.tokens.total)
            self.recorder.restore(run_id, payload)
        return RunState(
            frozenset(opened.terms.models),
            run_budget,
            frozenset(opened.terms.server_tools or ()),
            optimizer,
        )

    def reserve(
        self, call: Call, claims: TokenClaims, prompt: int, choices: int, max_tokens: int
    ) -> None:
        """Reserve ``prompt + choices * max_tokens`` or refuse 402 (recorded)."""
        call.prompt_bound = prompt
        # Within the exact JSON range by the request and setting bounds (gateway.limits).
        call.reserved = exact_count(prompt + choices * max_tokens, "reservation")
        limit = call.fmt.limit_field
        run = self.run_state(claims.run_id)
        if claims.scope != "target":  # metered and capped by a cap of its own
            left = run.optimizer.reserve(call.call_id, call.reserved)
            if left is not None:
                message = optimizer_refusal(
                    call.reserved, prompt, limit, max_tokens, left, run.optimizer
                )
                raise Denial(402, "insufficient_quota", "budget_exhausted", message)
            return
        denial: list[Denial] = []

        def on_denied(state: GatewayBudgetState, which: str) -> None:
            call.budget = state
            cap, left = (
                (state.cap, state.cap - state.settled - state.outstanding)
                if which == "run"
                else (
                    state.trial_cap or 0,
                    (state.trial_cap or 0) - state.trial_settled - state.trial_outstanding,
                )
            )
            denial.append(
                Denial(
                    402,
                    "insufficient_quota",
                    "budget_exhausted",
                    f"{which} token budget: this call reserves {call.reserved} tokens "
                    f"(prompt bound {prompt} + {limit} {max_tokens}), {max(left, 0)} of "
                    f"{cap} remain; lower {limit} or stop",
                )
            )
            d = denial[0]
            self.recorder.record(
                call, allowed=False, status=d.status, code=d.code, reason=d.message
            )

        state, index = run.budget.reserve(call.call_id, call.trial_id, call.reserved, on_denied)
        if index is None:
            denial[0].recorded = True
            raise denial[0]
        call.budget = state
        call.reservation_index = index

    def settle(
        self,
        call: Call,
        *,
        status: int,
        usage: TokenUsage | None,
        response: bytes,
        model_reported: str | None,
        reason: str | None = None,
    ) -> None:
        """Charge the call: ``usage`` as reported, or (None) its whole reservation."""
        estimated = usage is None
        if usage is None:
            output = call.reserved - call.prompt_bound
            usage = TokenUsage(
                input=call.prompt_bound, output=output, total=call.prompt_bound + output
            )

        def on_settled() -> None:
            self.recorder.record(
                call,
                allowed=True,
                status=status,
                tokens=usage,
                response=response,
                usage_estimated=estimated,
                model_reported=model_reported,
                reason=reason,
            )

        if call.reservation_index is not None:
            budget = self.run_state(str(call.run_id)).budget
            budget.settle(call.call_id, usage.total, on_settled)
        else:
            on_settled()
            if call.scope == "optimizer" and call.run_id is not None:
                self.run_state(call.run_id).optimizer.settle(call.call_id, usage.total)
