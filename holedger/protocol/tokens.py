"""The target-token budget decision, shared by the gateway (to decide) and replay (to check).

A call's reservation fits when the run's settled and outstanding tokens plus the
reservation stay within its cap, and likewise for its trial when a per-trial cap is set.
"""

from __future__ import annotations

from typing import Literal

from holedger.schemas.events import BudgetVector, GatewayBudgetState

# The optimizer scope's token cap when the task names none (budget.optimizer_tokens):
# generous, ten times the default target budget; only a runaway optimizer reaches it.
DEFAULT_OPTIMIZER_TOKENS = 20_000_000


def optimizer_cap(budget: BudgetVector) -> int:
    """The optimizer scope's token cap under ``budget``."""
    cap = budget.optimizer_tokens
    return DEFAULT_OPTIMIZER_TOKENS if cap is None else cap


def fits(cap: int, settled: int, outstanding: int, amount: int) -> bool:
    """The one budget rule: a reservation fits when nothing can then exceed the cap."""
    return settled + outstanding + amount <= cap


def budget_denial(state: GatewayBudgetState, amount: int) -> Literal["run", "trial"] | None:
    """None when ``amount`` fits ``state``; else which cap it breaks ("run" or "trial")."""
    if not fits(state.cap, state.settled, state.outstanding, amount):
        return "run"
    if state.trial_cap is not None and not fits(
        state.trial_cap, state.trial_settled, state.trial_outstanding, amount
    ):
        return "trial"
    return None
