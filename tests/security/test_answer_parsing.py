"""A harness's stdout is the only thing of it the server reads: hostile output must parse
to a recordable answer or to none, and never raise in the trusted process."""

from __future__ import annotations

import pytest

from holedger.protocol.answers import MAX_ANSWER_BYTES, parse_answer
from holedger.schemas.canonical import canonical_json

HOSTILE = [
    b'\xff\xfe{"answer": 1}',  # invalid UTF-8
    b'{"answer": "\xc3\x28"}',  # invalid UTF-8 inside a string
    b'{"answer": "a\\u0000b"}\n',  # NUL escaped
    b'{"answer": "a\x00b"}',  # a raw NUL byte
    b"[" * 200_000 + b"]" * 200_000,  # nesting past the recursion limit
    b'{"answer": ' + b"9" * 100_000 + b"}",  # an integer past int's digit limit
    b'{"answer": NaN}',
    b'{"answer": Infinity}',
    b'{"answer": 1e999}',
    b'{"a": 1, "a": 2}',  # a duplicate key
    b'"\\ud800"',  # a lone surrogate
    b"log line\n" * 1000 + b'{"answer": 1}',
    b" " * (MAX_ANSWER_BYTES + 10) + b'{"answer": 1}',
    b'{"answer": 1}' + b"x" * (MAX_ANSWER_BYTES + 1),
]


@pytest.mark.parametrize("stdout", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_stdout_parses_to_a_recordable_answer_or_none(stdout: bytes) -> None:
    natural, recorded = parse_answer(stdout)
    assert (natural is None) == (recorded is None)
    if recorded is not None:
        assert isinstance(canonical_json(recorded), bytes)


def test_nan_and_infinity_are_not_answers() -> None:
    assert parse_answer(b'{"answer": NaN}') == (None, None)
    assert parse_answer(b"Infinity") == (None, None)
