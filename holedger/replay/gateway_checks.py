"""Replay of the gateway: re-derive the target-token budget and check every decision.

From the GatewayCall events alone (no re-execution) this projection checks:

* ``gateway_tokens``: each call's tokens follow the convention (total = input + output,
  cached within input, reasoning within output), a denied call charged nothing, and a call
  whose usage never arrived was charged exactly its reservation;
* ``gateway_allowlist``: every allowed target call asked for a model in the run's
  allow-list (exact names), and every "model_not_allowed" denial asked for one outside it;
* ``gateway_budget``: the settlements carry reservation indices 0..M-1 once each; for
  every budget decision the recorded state (settled, outstanding, per trial too) equals
  the state re-derived from the settlements before it, and the decision is what
  :func:`holedger.gateway.budget.budget_denial` says for that state;
* ``gateway_cap``: the settled target tokens do not exceed the cap (overshoot 0);
* ``gateway_trial_totals``: each TrialCompleted's tokens and gateway_calls equal the sum
  and count of the GatewayCalls attributed to its trial.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from holedger.gateway.budget import add_usage, budget_denial
from holedger.ledger.records import Record
from holedger.replay.report import ReportBuilder
from holedger.schemas.events import (
    GatewayBudgetState,
    GatewayCall,
    Model,
    RunOpened,
    TokenUsage,
    TrialCompleted,
)

CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class _Settled:
    seq: int
    position: int
    index: int
    trial: str
    reserved: int
    total: int


class _Fenwick:
    def __init__(self, size: int) -> None:
        self.tree = [0] * (size + 1)

    def add(self, i: int, value: int) -> None:
        i += 1
        while i < len(self.tree):
            self.tree[i] += value
            i += i & -i

    def prefix(self, n: int) -> int:
        """Sum of the first ``n`` entries."""
        total = 0
        n = min(n, len(self.tree) - 1)
        while n > 0:
            total += self.tree[n]
            n -= n & -n
        return total


class GatewayProjection:
    name = "gateway"

    def __init__(self, ctx: Any) -> None:
        opened: RunOpened = ctx.opened
        self.models = frozenset(opened.terms.models)
        self.cap = opened.terms.budget.target_tokens
        self.trial_cap = opened.terms.budget.per_trial_tokens
        self.calls: list[tuple[int, GatewayCall]] = []
        self.trials: list[tuple[int, TrialCompleted]] = []

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, GatewayCall):
            self.calls.append((rec.seq, payload))
        elif isinstance(payload, TrialCompleted):
            self.trials.append((rec.seq, payload))

    # ------------------------------------------------------------------ finish

    def finish(self, out: ReportBuilder) -> None:
        if not self.calls and not self.trials:
            out.section("gateway", {"calls": 0})
            return
        for name, detail in (
            ("gateway_tokens", "every call's tokens follow the convention"),
            ("gateway_allowlist", "every allow/deny decision matches the exact allow-list"),
            ("gateway_budget", "every budget decision matches the re-derived token budget"),
            ("gateway_cap", "settled target tokens within the cap"),
            ("gateway_trial_totals", "every trial's tokens equal the sum of its calls"),
        ):
            out.declare(name, detail)
        for seq, call in self.calls:
            self._check_tokens(out, seq, call)
            self._check_allowlist(out, seq, call)
        settled = self._check_budget(out)
        self._check_trials(out)
        self._section(out, settled)

    def _check_tokens(self, out: ReportBuilder, seq: int, call: GatewayCall) -> None:
        t = call.tokens
        problem = None
        if t.total != t.input + t.output:
            problem = f"total {t.total} is not input {t.input} + output {t.output}"
        elif t.cached > t.input or t.reasoning > t.output:
            problem = "cached tokens exceed input or reasoning tokens exceed output"
        elif not call.allowed and (t.total or call.reservation_index is not None):
            problem = "a denied call was charged or holds a reservation"
        elif call.usage_estimated and t.total != call.reserved:
            problem = f"estimated usage {t.total} is not the reservation {call.reserved}"
        if problem:
            out.fail(seq, "GatewayCall", problem, check="gateway_tokens")

    def _check_allowlist(self, out: ReportBuilder, seq: int, call: GatewayCall) -> None:
        if call.scope != "target" or call.model_requested is None:
            return
        listed = call.model_requested in self.models
        if call.allowed and call.endpoint == CHAT and not listed:
            out.fail(
                seq,
                "GatewayCall",
                f"model {call.model_requested!r} allowed but not in the allow-list",
                check="gateway_allowlist",
            )
        if call.code == "model_not_allowed" and listed:
            out.fail(
                seq,
                "GatewayCall",
                f"model {call.model_requested!r} denied but it is in the allow-list",
                check="gateway_allowlist",
            )

    def _check_budget(self, out: ReportBuilder) -> list[_Settled]:
        settled: list[_Settled] = []
        decisions: list[tuple[int, GatewayCall]] = []
        for seq, call in self.calls:
            if call.scope != "target":
                continue
            if call.reservation_index is not None:
                settled.append(
                    _Settled(
                        seq,
                        len(settled),
                        call.reservation_index,
                        call.trial_id or "",
                        call.reserved,
                        call.tokens.total,
                    )
                )
            if call.allowed and call.endpoint == CHAT and call.reservation_index is None:
                out.fail(
                    seq, "GatewayCall", "allowed without a reservation", check="gateway_budget"
                )
            if call.reservation_index is not None or call.code == "budget_exhausted":
                if call.budget is None:
                    out.fail(
                        seq,
                        "GatewayCall",
                        "budget decision without its state",
                        check="gateway_budget",
                    )
                else:
                    decisions.append((seq, call))
        indices = sorted(s.index for s in settled)
        if indices != list(range(len(settled))):
            out.fail(
                None,
                "GatewayCall",
                "reservation indices are not 0..M-1 once each (a call is missing or duplicated)",
                check="gateway_budget",
            )
            return settled
        self._check_decisions(out, settled, decisions)
        total = sum(s.total for s in settled)
        if total > self.cap:
            out.fail(
                None,
                "GatewayCall",
                f"settled target tokens {total} exceed the cap {self.cap}",
                check="gateway_cap",
            )
        else:
            out.check("gateway_cap", True, f"{total} of {self.cap} target tokens settled")
        return settled

    def _check_decisions(
        self,
        out: ReportBuilder,
        settled: list[_Settled],
        decisions: list[tuple[int, GatewayCall]],
    ) -> None:
        m = len(settled)
        by_index = sorted(settled, key=lambda s: s.index)
        reserved_before = [0]
        for s in by_index:
            reserved_before.append(reserved_before[-1] + s.reserved)
        settled_before = [0]
        for s in settled:
            settled_before.append(settled_before[-1] + s.total)
        # Outstanding at (n, r) = reservations with index < r not settled among the first n
        # settlements: answered offline, sweeping the settlements in ledger order.
        fenwick = _Fenwick(m)
        by_trial: dict[str, list[_Settled]] = defaultdict(list)
        for s in settled:
            by_trial[s.trial].append(s)
        queries = sorted(decisions, key=lambda d: _state(d[1]).settled_calls)
        swept = 0
        for seq, call in queries:
            state = _state(call)
            n, r = state.settled_calls, state.reservations
            if n > m or r > m or n > r:
                out.fail(
                    seq, "GatewayCall", "budget state counts are impossible", check="gateway_budget"
                )
                continue
            while swept < n:
                fenwick.add(settled[swept].index, settled[swept].reserved)
                swept += 1
            derived = GatewayBudgetState(
                cap=self.cap,
                settled=settled_before[n],
                outstanding=reserved_before[r] - fenwick.prefix(r),
                settled_calls=n,
                reservations=r,
                trial_cap=self.trial_cap,
                **_trial_part(by_trial.get(call.trial_id or "", []), n, r),
            )
            self._check_one(out, seq, call, state, derived)

    def _check_one(
        self,
        out: ReportBuilder,
        seq: int,
        call: GatewayCall,
        recorded: GatewayBudgetState,
        derived: GatewayBudgetState,
    ) -> None:
        if recorded != derived:
            out.fail(
                seq,
                "GatewayCall",
                f"recorded budget state {_brief(recorded)} differs from the re-derived "
                f"{_brief(derived)}",
                check="gateway_budget",
            )
            return
        if call.reservation_index is not None and call.reservation_index != recorded.reservations:
            out.fail(seq, "GatewayCall", "reservation index out of order", check="gateway_budget")
        denial = budget_denial(derived, call.reserved)
        if call.allowed and denial is not None:
            out.fail(
                seq,
                "GatewayCall",
                f"allowed over the {denial} cap: reserving {call.reserved} with {_brief(derived)}",
                check="gateway_budget",
            )
        if not call.allowed and denial is None:
            out.fail(
                seq, "GatewayCall", "denied although it fits the budget", check="gateway_budget"
            )

    def _check_trials(self, out: ReportBuilder) -> None:
        sums: dict[str, TokenUsage] = defaultdict(TokenUsage)
        counts: dict[str, int] = defaultdict(int)
        for _, call in self.calls:
            if call.trial_id is not None:
                sums[call.trial_id] = add_usage(sums[call.trial_id], call.tokens)
                counts[call.trial_id] += 1
        for seq, trial in self.trials:
            expected = sums.get(trial.trial_id, TokenUsage())
            if trial.tokens != expected or trial.gateway_calls != counts.get(trial.trial_id, 0):
                out.fail(
                    seq,
                    "TrialCompleted",
                    f"trial {trial.trial_id} reports {trial.tokens.total} tokens in "
                    f"{trial.gateway_calls} calls; its GatewayCalls sum to {expected.total} in "
                    f"{counts.get(trial.trial_id, 0)}",
                    check="gateway_trial_totals",
                )

    def _section(self, out: ReportBuilder, settled: list[_Settled]) -> None:
        target = [c for _, c in self.calls if c.scope == "target"]
        optimizer = [c for _, c in self.calls if c.scope == "optimizer"]
        total = TokenUsage()
        for call in target:
            total = add_usage(total, call.tokens)
        opt_total = TokenUsage()
        for call in optimizer:
            opt_total = add_usage(opt_total, call.tokens)
        denied: dict[str, int] = defaultdict(int)
        for _, call in self.calls:
            if not call.allowed:
                denied[call.code or "denied"] += 1
        out.section(
            "gateway",
            {
                "calls": len(self.calls),
                "target_cap": self.cap,
                "per_trial_cap": self.trial_cap,
                "target_tokens": total.model_dump(),
                "target_settled": sum(s.total for s in settled),
                "overshoot": max(0, sum(s.total for s in settled) - self.cap),
                "estimated_calls": sum(1 for c in target if c.usage_estimated),
                "optimizer_tokens": opt_total.model_dump(),
                "denied": dict(sorted(denied.items())),
                "trials_checked": len(self.trials),
            },
        )


def _state(call: GatewayCall) -> GatewayBudgetState:
    assert call.budget is not None
    return call.budget


def _trial_part(rows: list[_Settled], n: int, r: int) -> dict[str, int]:
    settled = sum(s.total for s in rows if s.position < n)
    outstanding = sum(s.reserved for s in rows if s.index < r and s.position >= n)
    return {"trial_settled": settled, "trial_outstanding": outstanding}


def _brief(state: GatewayBudgetState) -> str:
    text = f"settled {state.settled} + outstanding {state.outstanding} of {state.cap}"
    if state.trial_cap is not None:
        text += f", trial {state.trial_settled} + {state.trial_outstanding} of {state.trial_cap}"
    return text
