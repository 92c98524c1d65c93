"""Bounds on every number a request brings into the gateway, checked before any arithmetic.

A request's limits (``max_tokens``, ``max_completion_tokens``), its choice count ``n`` and
the other numeric fields of a chat request are each held to a documented range; a value
outside it (or of the wrong kind: a boolean, a fraction where a whole number is meant) is
answered 400 naming the field and the bound, and nothing is forwarded. The settings that
enter the reservation (body size, default max_tokens, tokens per media part) have bounds
of their own, so that

    reservation = prompt bound + n * max_tokens
                <= MAX_BODY_BYTES + MAX_BODY_BYTES * MAX_MEDIA_PART_TOKENS
                   + MAX_CHOICES * MAX_OUTPUT_TOKENS  (about 2**50)

stays well inside the exact JSON range (2**53 - 1) by construction: every number the
gateway puts into an event can be encoded (docs/GATEWAY.md, "Bounds").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from holedger.schemas.types import EXACT_INT_MAX

# Above any model's output window; a larger request is refused, not clamped.
MAX_OUTPUT_TOKENS = 2**24
MAX_CHOICES = 128  # the OpenAI API's own limit on n
MAX_BODY_BYTES = 2**30  # the highest max_body_bytes setting
MAX_MEDIA_PART_TOKENS = 2**20  # the highest media_part_tokens setting
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The largest reservation the bounds allow; it must stay an exact JSON integer.
MAX_RESERVATION = (
    MAX_BODY_BYTES + MAX_BODY_BYTES * MAX_MEDIA_PART_TOKENS + MAX_CHOICES * MAX_OUTPUT_TOKENS
)
assert MAX_RESERVATION <= EXACT_INT_MAX


@dataclass(frozen=True)
class Bound:
    """One numeric request field: its inclusive range, and whether it is a whole number."""

    field: str
    low: int | float
    high: int | float
    whole: bool = True

    def describe(self) -> str:
        kind = "an integer" if self.whole else "a number"
        return f"{kind} from {_fmt(self.low)} to {_fmt(self.high)}"


# The Chat Completions request: every numeric field the gateway reads or forwards.
CHAT_BOUNDS: tuple[Bound, ...] = (
    Bound("max_tokens", 1, MAX_OUTPUT_TOKENS),
    Bound("max_completion_tokens", 1, MAX_OUTPUT_TOKENS),
    Bound("n", 1, MAX_CHOICES),
    Bound("top_logprobs", 0, 20),
    Bound("seed", INT64_MIN, INT64_MAX),
    Bound("temperature", 0, 2, whole=False),
    Bound("top_p", 0, 1, whole=False),
    Bound("frequency_penalty", -2, 2, whole=False),
    Bound("presence_penalty", -2, 2, whole=False),
)


class OutOfBounds(ValueError):
    """A request field outside its bound: ``field`` and a one-line ``message``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def check_bounds(body: Mapping[str, Any], bounds: tuple[Bound, ...] = CHAT_BOUNDS) -> None:
    """Raise OutOfBounds for the first field of ``bounds`` that ``body`` holds out of range.

    A field that is absent or null is not checked (the upstream's default applies, or
    the gateway imposes its own limit). Only comparisons are made: no arithmetic on the
    value happens before it is known to be in range.
    """
    for bound in bounds:
        value = body.get(bound.field)
        if value is None:
            continue
        if not _in_range(value, bound):
            raise OutOfBounds(bound.field, f"'{bound.field}' must be {bound.describe()}")


def _in_range(value: Any, bound: Bound) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return bound.low <= value <= bound.high
    if isinstance(value, float) and not bound.whole:
        return math.isfinite(value) and bound.low <= value <= bound.high
    return False


def check_setting(name: str, value: int, low: int, high: int) -> int:
    """A gateway setting that enters the reservation, held to its bound (ValueError)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {_fmt(high)}")
    return value


def _fmt(value: int | float) -> str:
    if isinstance(value, int) and abs(value) >= 2**16:
        exponent = value.bit_length() - 1 if value > 0 else (-value).bit_length() - 1
        if value == 2**exponent:
            return f"{value} (2**{exponent})"
        if value == 2 ** (exponent + 1) - 1:
            return f"{value} (2**{exponent + 1} - 1)"
        if value == -(2**exponent):
            return f"{value} (-2**{exponent})"
    return str(value)
