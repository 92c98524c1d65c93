"""The optimizer scope's token cap: metered and capped, like the target scope.

A run's terms may set ``budget.optimizer_tokens``; a task that does not gets
DEFAULT_OPTIMIZER_TOKENS (protocol.tokens), a generous cap that only a runaway optimizer
reaches. Calls with the run's optimizer token reserve ``prompt bound + n * max_tokens``
before they are forwarded, exactly as target calls do, and are refused 402
``budget_exhausted`` when ``settled + outstanding + reservation`` would pass the cap;
the reservation is replaced by the usage reported (or kept whole when none arrives). So
the settled optimizer tokens never exceed the cap, which replay checks
(``gateway_optimizer_cap``) from the recorded calls alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from holedger.protocol.tokens import DEFAULT_OPTIMIZER_TOKENS, optimizer_cap

__all__ = ["DEFAULT_OPTIMIZER_TOKENS", "OptimizerBudget", "optimizer_cap", "optimizer_refusal"]


@dataclass
class OptimizerBudget:
    """One run's optimizer-scope tokens: settled, and reserved by calls in flight."""

    cap: int
    settled: int = 0
    _outstanding: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reserve(self, call_id: str, amount: int) -> int | None:
        """Reserve ``amount`` for the call; None when it fits, else the tokens left."""
        with self._lock:
            outstanding = sum(self._outstanding.values())
            if self.settled + outstanding + amount > self.cap:
                return max(self.cap - self.settled - outstanding, 0)
            self._outstanding[call_id] = amount
            return None

    def settle(self, call_id: str, total: int) -> None:
        """Replace the call's reservation by the tokens it was charged (if it held one)."""
        with self._lock:
            if self._outstanding.pop(call_id, None) is not None:
                self.settled += total

    def remaining(self) -> int:
        with self._lock:
            return max(self.cap - self.settled - sum(self._outstanding.values()), 0)

    def restore(self, total: int) -> None:
        """Count one already-recorded optimizer call (a gateway restarting on a run)."""
        with self._lock:
            self.settled += total


def optimizer_refusal(
    reserved: int, prompt: int, limit: str, max_tokens: int, left: int, budget: OptimizerBudget
) -> str:
    """The 402 message of an optimizer call that does not fit the optimizer's cap."""
    return (
        f"optimizer token budget: this call reserves {reserved} tokens (prompt bound "
        f"{prompt} + {limit} {max_tokens}), {left} of {budget.cap} remain; lower {limit} "
        "or stop"
    )
