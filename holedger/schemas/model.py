"""The base of every schema and the patterns of the envelope's time and run id.

``Model`` fixes what every schema shares (immutable, no unknown fields, fields in
canonical order); ``holedger.schemas.events`` re-exports all of it.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel, ConfigDict

# A UTC time with microseconds and a literal Z, of a real day: a date of the proleptic
# Gregorian calendar from 0001-01-01 to 9999-12-31 (29 February in leap years only) and a
# time from 00:00:00 to 23:59:59.999999 (no leap second). No capturing group: record
# patterns embed it. tests/ledger/test_time_pattern.py checks it against datetime.
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
    r"|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
    rf"|{_LEAP_YEAR}-02-29)"
)
TIME_PATTERN = rf"^{_DATE}T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{{6}}Z$"
RUN_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"


class Model(BaseModel):
    """Base of every schema: immutable, no unknown fields, fields in canonical order.

    Each model's fields are put in code-point order of their names, whatever order the
    class body declares them in: a validated instance then serialises (``to_json``,
    ``model_dump_json``) with its members already sorted, as canonical JSON has them,
    which lets replay check a payload canonical by re-serialising it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        declared = inspect.get_annotations(cls)
        if declared:
            cls.__annotations__ = dict(sorted(declared.items()))
        super().__init_subclass__(**kwargs)
