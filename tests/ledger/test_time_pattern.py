"""The envelope's time is a real UTC time, on every path that reads it.

``schemas.events.TIME_PATTERN`` spells the whole rule (date of the Gregorian calendar,
leap years, time of day, microseconds, a literal Z) as a regular expression, so that the
envelope model, the reference parser and replay's record patterns, which embed it, agree.
Here it is held against ``datetime`` for every month and day number of a set of years
chosen for the leap-year rule, and a record with an impossible time is refused by each
path: the strict parser, the fast parser and the chunk check.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest

from holedger.errors import VerificationError
from holedger.ledger.fastpath import _parse_fast, parse_record, record_pattern
from holedger.ledger.keys import SigningKey
from holedger.ledger.records import parse_record_strict, sign_envelope
from holedger.replay.chunks import BLOB_FIELDS
from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import EVENT_TYPES, TIME_PATTERN, EventEnvelope

TIME = re.compile(TIME_PATTERN)
# The leap-year rule's cases: divisible by 4, by 100 and not 400, by 400; year one, the
# last year, and year zero (which datetime has no room for).
YEARS = [0, 1, 4, 99, 100, 400, 1600, 1700, 1900, 2000, 2023, 2024, 2026, 2100, 9996, 9999]


def real(text: str) -> bool:
    try:
        datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("year", YEARS)
def test_every_day_of_the_year_agrees_with_datetime(year: int) -> None:
    accepted = 0
    for month in range(0, 14):
        for day in range(0, 33):
            text = f"{year:04d}-{month:02d}-{day:02d}T12:30:59.000001Z"
            assert bool(TIME.fullmatch(text)) == real(text), text
            accepted += bool(TIME.fullmatch(text))
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    assert accepted == (0 if year == 0 else 366 if leap else 365)


def test_every_time_of_day_agrees_with_datetime() -> None:
    for hour in range(0, 26):
        for minute in (0, 9, 10, 59, 60, 61):
            for second in (0, 59, 60, 61, 99):
                text = f"2026-12-02T{hour:02d}:{minute:02d}:{second:02d}.999999Z"
                assert bool(TIME.fullmatch(text)) == real(text), text


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-02T07:35:25Z",  # no microseconds
        "2026-12-02T07:35:25.77903Z",
        "2026-12-02T07:35:25.779031+00:00",
        "2026-12-02 07:35:25.779031Z",
        "2026-12-02T07:35:25.779031z",
        "+2026-12-02T07:35:25.779031Z",
        "12026-12-02T07:35:25.779031Z",
        "2026-12-02T07:35:25.779031Z\n",
    ],
)
def test_other_spellings_are_refused(text: str) -> None:
    assert not TIME.fullmatch(text)


KEY = SigningKey.from_seed("time-test", bytes(range(32)))
RUN = "5cc5c15a-c7bd-4381-be43-6f071cd22836"


def record(time: str) -> bytes:
    env: dict[str, Any] = {
        "key_id": KEY.key_id_hex,
        "payload": {"candidate": "0" * 40},
        "prev_hash": "ab" * 32,
        "role": "server",
        "run_id": RUN,
        "schema_version": 1,
        "seq": 7,
        "time": time,
        "type": "CandidateNominated",
    }
    return sign_envelope(KEY, env, canonical_json(env)).raw


@pytest.mark.parametrize(
    "time",
    ["2026-13-02T07:35:25.779031Z", "2026-02-29T07:35:25.779031Z", "2026-12-02T24:00:00.000000Z"],
)
def test_a_record_with_an_impossible_time_is_refused_everywhere(time: str) -> None:
    good = record("2024-02-29T23:59:59.999999Z")
    bad = record(time)
    found = record_pattern(RUN, BLOB_FIELDS, EVENT_TYPES)
    assert found is not None
    pattern = found[0]
    # the same record with a real time passes each path: each refusal below is the time's
    assert _parse_fast(good) is not None and pattern.fullmatch(good)
    assert parse_record_strict(good).time == "2024-02-29T23:59:59.999999Z"
    assert _parse_fast(bad) is None
    assert pattern.fullmatch(bad) is None
    with pytest.raises(VerificationError, match="time"):
        parse_record_strict(bad)
    with pytest.raises(VerificationError, match="time"):
        parse_record(bad)


def test_the_envelope_model_agrees() -> None:
    fields: dict[str, Any] = {
        "key_id": KEY.key_id_hex,
        "payload": {},
        "prev_hash": "ab" * 32,
        "role": "server",
        "run_id": RUN,
        "schema_version": 1,
        "seq": 0,
        "type": "RunClosed",
    }
    EventEnvelope(**fields, time="2000-02-29T00:00:00.000000Z")
    with pytest.raises(ValueError, match="time"):
        EventEnvelope(**fields, time="1900-02-29T00:00:00.000000Z")
