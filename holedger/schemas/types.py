"""Small shared field types: exact rationals, digests, key ids, roles."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

from holedger.errors import CanonicalError
from holedger.schemas.canonical import MAX_SAFE_INTEGER, rational_to_str, str_to_rational

# Every integer of an event lies in the exact JSON range [-(2**53 - 1), 2**53 - 1]: the
# types below refuse any other value when the model is built (where the number is made),
# so an event that validated can always be encoded and signed.
EXACT_INT_MAX = MAX_SAFE_INTEGER
ExactInt = Annotated[int, Field(ge=-EXACT_INT_MAX, le=EXACT_INT_MAX)]
"""Any integer an event may hold (the exact JSON range)."""
Count = Annotated[int, Field(ge=0, le=EXACT_INT_MAX)]
"""A non-negative integer within the exact JSON range (counts, sizes, tokens, ms)."""
PositiveCount = Annotated[int, Field(ge=1, le=EXACT_INT_MAX)]
"""A positive integer within the exact JSON range (K, attempts, intervals)."""


def exact_count(value: int, name: str) -> int:
    """``value`` when it is a Count; else ValueError naming ``name`` and the bound.

    For numbers computed outside a model (a reservation, a sum) and checked where they
    are made, before anything is decided on them."""
    if not 0 <= value <= EXACT_INT_MAX:
        raise ValueError(f"{name} {value} is outside 0..{EXACT_INT_MAX}")
    return value


RATIONAL_PATTERN = r"^-?(0|[1-9][0-9]*)(\.[0-9]*[1-9]|/[1-9][0-9]*)?$"


def _to_fraction(value: Any) -> Fraction:
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        raise ValueError("a boolean is not a rational")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, str):
        try:
            return str_to_rational(value)
        except CanonicalError as exc:
            raise ValueError(str(exc)) from exc
    raise ValueError(f"expected an exact rational string, got {type(value).__name__}")


Rational = Annotated[
    Fraction,
    BeforeValidator(_to_fraction),
    PlainSerializer(rational_to_str, return_type=str),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": RATIONAL_PATTERN,
            "description": "exact rational: integer, terminating decimal, or p/q",
        }
    ),
]
"""An exact rational number, serialised as its one canonical string (``"0.25"``, ``"1/3"``)."""


def sha256_hex(value: Any) -> str:
    """The validator of Sha256Hex: 64 lower-case hex characters, returned unchanged."""
    return _hex(value, 64)


def key_id_hex(value: Any) -> str:
    """The validator of KeyIdHex: 8 lower-case hex characters, returned unchanged."""
    return _hex(value, 8)


Sha256Hex = Annotated[
    str,
    WithJsonSchema({"type": "string", "pattern": "^[0-9a-f]{64}$"}),
    BeforeValidator(sha256_hex),
]
KeyIdHex = Annotated[
    str,
    WithJsonSchema({"type": "string", "pattern": "^[0-9a-f]{8}$"}),
    BeforeValidator(key_id_hex),
]

# Validators that accept exactly the strings whose characters match the pattern (no
# quotes, nothing to escape) and return them unchanged; schemas.recognize relies on it.
EXACT_STRING_VALIDATORS: dict[Any, bytes] = {
    sha256_hex: rb"[0-9a-f]{64}",
    key_id_hex: rb"[0-9a-f]{8}",
}

Role = Literal["server", "gateway", "sandbox"]
ROLES: tuple[Role, ...] = ("server", "gateway", "sandbox")
Split = Literal["dev", "val", "test"]
SearchSplit = Literal["dev", "val"]


_LOWER_HEX = re.compile(r"[0-9a-f]*")


def _hex(value: Any, length: int) -> str:
    if not isinstance(value, str) or len(value) != length or not _LOWER_HEX.fullmatch(value):
        raise ValueError(f"expected {length} lower-case hex characters")
    return value


ZERO_HASH = "0" * 64
