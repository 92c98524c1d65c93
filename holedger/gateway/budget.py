"""Target-token accounting: reserve before forwarding, settle to actual usage after.

The decision itself (:mod:`holedger.protocol.tokens`) is shared by the gateway (to
decide) and replay (to check the recorded decision against the state it re-derives):

* a call reserves ``prompt upper bound + n * max_tokens`` before it is forwarded;
* it is allowed only if ``settled + outstanding + reservation <= cap`` for the run, and
  the same for its trial when a per-trial cap is set;
* after the response it settles to the usage the upstream reported, or to its whole
  reservation when no usage arrived (marked ``usage_estimated``).

Because the prompt bound is an upper bound of any byte-level tokenization and the upstream
enforces ``max_tokens``, the settled total can never exceed what was reserved, so the
settled total never exceeds the cap, however many calls run at once.

:class:`RunBudget` holds one run's live state. Every operation on it is one synchronous
step under a lock, so a decision and its reservation are atomic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from holedger.protocol.tokens import budget_denial, fits
from holedger.schemas.events import GatewayBudgetState, TokenUsage

__all__ = ["budget_denial", "fits"]

IMAGE_PART_TYPES = ("image_url", "input_image", "input_audio", "file")


def prompt_upper_bound(body_bytes: int, body: dict[str, Any], per_image: int) -> int:
    """An upper bound of the prompt's tokens: every byte of the body, plus media parts.

    A byte-level BPE token covers at least one byte, and the JSON around each message is
    longer than the chat template's per-message tokens, so the body's byte length bounds
    any text prompt. A referenced image or file costs tokens its bytes do not show; each
    such part adds ``per_image``.
    """
    media = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                media += sum(
                    1
                    for part in content
                    if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES
                )
    return body_bytes + media * per_image


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    """The output cap the request asks for (the smaller one when both fields are set)."""
    values = [
        body[key]
        for key in ("max_tokens", "max_completion_tokens")
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool)
    ]
    return min(values) if values else None


def choices_count(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


# More tokens than any one call can use: usage reporting more is not believed (the call
# is charged its reservation instead), and every recorded count stays an exact JSON number.
MAX_REPORTED_TOKENS = 2**32


class _Unbelievable(ValueError):
    pass


def _int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        if value > MAX_REPORTED_TOKENS:
            raise _Unbelievable(value)
        return value
    return 0


def usage_from_openai(usage: Any) -> TokenUsage | None:
    """Chat Completions (or Responses API) usage in holedger's convention, or None.

    Input includes cached tokens and output includes reasoning tokens (the OpenAI wire
    convention); total is input + output whatever the upstream's total says. A count
    over MAX_REPORTED_TOKENS makes the whole usage unusable (None).
    """
    try:
        return _usage(usage)
    except _Unbelievable:
        return None


def _usage(usage: Any) -> TokenUsage | None:
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        inp = _int(usage.get("prompt_tokens"))
        out = _int(usage.get("completion_tokens"))
        pdet = usage.get("prompt_tokens_details")
        cdet = usage.get("completion_tokens_details")
    elif "input_tokens" in usage or "output_tokens" in usage:
        inp = _int(usage.get("input_tokens"))
        out = _int(usage.get("output_tokens"))
        pdet = usage.get("input_tokens_details")
        cdet = usage.get("output_tokens_details")
    else:
        return None
    cached = _int(pdet.get("cached_tokens")) if isinstance(pdet, dict) else 0
    reasoning = _int(cdet.get("reasoning_tokens")) if isinstance(cdet, dict) else 0
    return TokenUsage(
        input=inp,
        cached=min(cached, inp),
        output=out,
        reasoning=min(reasoning, out),
        total=inp + out,
    )


def add_usage(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    return TokenUsage(
        input=a.input + b.input,
        cached=a.cached + b.cached,
        cache_write=a.cache_write + b.cache_write,
        output=a.output + b.output,
        reasoning=a.reasoning + b.reasoning,
        total=a.total + b.total,
    )


@dataclass
class _Reservation:
    trial_id: str | None
    amount: int
    index: int


@dataclass
class RunBudget:
    """One run's live target-token state: settled sums and outstanding reservations."""

    cap: int
    trial_cap: int | None
    settled: int = 0
    settled_calls: int = 0
    reservations: int = 0
    trial_settled: dict[str, int] = field(default_factory=dict)
    _outstanding: dict[str, _Reservation] = field(default_factory=dict)
    _outstanding_total: int = 0
    _trial_outstanding: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _state(self, trial_id: str | None) -> GatewayBudgetState:
        key = trial_id or ""
        return GatewayBudgetState(
            cap=self.cap,
            settled=self.settled,
            outstanding=self._outstanding_total,
            settled_calls=self.settled_calls,
            reservations=self.reservations,
            trial_cap=self.trial_cap,
            trial_settled=self.trial_settled.get(key, 0),
            trial_outstanding=self._trial_outstanding.get(key, 0),
        )

    def reserve(
        self,
        call_id: str,
        trial_id: str | None,
        amount: int,
        on_denied: Callable[[GatewayBudgetState, str], None],
    ) -> tuple[GatewayBudgetState, int | None]:
        """Decide and reserve in one step; returns the state seen and the reservation index.

        When the call does not fit, ``on_denied(state, which)`` runs under the lock (the
        denial is recorded in decision order) and the index is None.
        """
        with self._lock:
            state = self._state(trial_id)
            which = budget_denial(state, amount)
            if which is not None:
                on_denied(state, which)
                return state, None
            index = self.reservations
            self.reservations += 1
            self._outstanding[call_id] = _Reservation(trial_id, amount, index)
            self._outstanding_total += amount
            key = trial_id or ""
            self._trial_outstanding[key] = self._trial_outstanding.get(key, 0) + amount
            return state, index

    def settle(self, call_id: str, total: int, on_settled: Callable[[], None]) -> None:
        """Replace a reservation by the tokens charged; ``on_settled`` runs under the lock,
        before the state changes, so events reach the ledger in settlement order."""
        with self._lock:
            res = self._outstanding[call_id]
            # Recorded first: if recording fails, the reservation stands, to be settled
            # (and recorded) once, by whoever handles the failure.
            on_settled()
            del self._outstanding[call_id]
            self._outstanding_total -= res.amount
            key = res.trial_id or ""
            self._trial_outstanding[key] -= res.amount
            self.settled += total
            self.trial_settled[key] = self.trial_settled.get(key, 0) + total
            self.settled_calls += 1

    def restore(self, trial_id: str | None, total: int) -> None:
        """Count one already-recorded settlement (a gateway restarting on an open run)."""
        with self._lock:
            key = trial_id or ""
            self.settled += total
            self.trial_settled[key] = self.trial_settled.get(key, 0) + total
            self.settled_calls += 1
            self.reservations += 1

    @property
    def outstanding(self) -> int:
        return self._outstanding_total
