"""The officeqa-lite verifier: scores a harness answer against the expected number.

Runs in the trusted process only; its source digest is pinned in task.toml. Standard
library only, exact arithmetic (no floats).

The harness prints ``{"answer": A}``; ``A`` is a number or a string holding one number,
optionally with thousands separators, a leading ``$`` or a trailing ``%``. Anything else
(words, units, markdown) scores 0. A number within the case's tolerance of the expected
value scores 1; otherwise 0.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

_NUMBER = re.compile(r"^[-+−]?\$?[-+−]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?%?$")


def parse_number(value: Any) -> Fraction | None:
    """The exact number an answer holds, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | Decimal):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(Decimal(repr(value)))
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not _NUMBER.match(text):
        return None
    negative = text.count("-") + text.count("−") == 1
    digits = re.sub(r"[^0-9.]", "", text)
    try:
        number = Fraction(Decimal(digits))
    except (InvalidOperation, ValueError):
        return None
    return -number if negative else number


def score(case_input: dict[str, Any], expected: dict[str, Any], answer: Any) -> Fraction:
    """1 when the answer is within tolerance of the expected value, else 0."""
    del case_input  # the expected value says everything needed
    if not isinstance(answer, dict) or "answer" not in answer:
        return Fraction(0)
    got = parse_number(answer["answer"])
    if got is None:
        return Fraction(0)
    want = Fraction(Decimal(str(expected["value"])))
    tolerance = Fraction(Decimal(str(expected.get("tolerance", "0"))))
    return Fraction(1) if abs(got - want) <= tolerance else Fraction(0)
