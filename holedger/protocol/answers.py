"""A harness's answer: parsed from its output, and the bytes of the answer blob.

Answers are JSON. So that they can be hashed and shown as canonical JSON (which holds no
floats), a number with a fraction or exponent is kept as its source text (a string), and
an integer beyond 2**53 likewise; the verifier sees the answer as parsed normally. The
server parses each trial's output with :func:`parse_answer` and replay parses the
recorded output again with it, so both read the same answer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from holedger.errors import CanonicalError
from holedger.schemas.canonical import MAX_DEPTH, MAX_SAFE_INTEGER, canonical_json, plain_json

MAX_ANSWER_BYTES = 1 << 20
# How deep an answer may nest: a dev projection holds it about 8 levels down in its event,
# and the whole event must stay within the canonical depth limit (64).
MAX_ANSWER_DEPTH = 32


def parse_answer(stdout: bytes) -> tuple[Any | None, Any | None]:
    """(answer as the verifier sees it, answer as recorded) or (None, None)."""
    text = stdout.strip()
    if not text or len(text) > MAX_ANSWER_BYTES:
        return None, None
    # A harness may log before its answer: the answer is the last non-empty line when the
    # whole output is not one JSON document.
    candidates = [text]
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        candidates.append(lines[-1])
    for chunk in candidates:
        try:
            natural = json.loads(chunk)
            recorded = json.loads(chunk, parse_float=str, parse_int=_safe_int)
            canonical_json(recorded)
        except (ValueError, CanonicalError, RecursionError):
            continue
        if not plain_json(recorded, MAX_DEPTH - MAX_ANSWER_DEPTH):
            # Recorded inside a projection inside an event, the answer must still fit the
            # canonical depth limit there: a deeper one is no answer.
            continue
        return natural, recorded
    return None, None


def _safe_int(text: str) -> int | str:
    value = int(text)
    return value if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else text


def answer_bytes(answer: Any) -> bytes:
    """The bytes of the answer blob: canonical JSON of the parsed answer."""
    return canonical_json(answer)


def answer_digest(answer: Any) -> str:
    """The SHA-256 of :func:`answer_bytes` (the TrialCompleted answer_digest)."""
    return hashlib.sha256(answer_bytes(answer)).hexdigest()
