"""holedger canonical JSON: the exact bytes that are hashed and signed.

The rules (docs/FORMAT.md, "Canonical JSON") are a strict subset of RFC 8785 (JCS):

* objects with member names sorted by code point, no duplicate names (holedger's own
  names are ASCII, where this is the JCS UTF-16 order too; task case ids used as names,
  as in a dev projection, may not be, and there the two orders can differ);
* no insignificant whitespace: separators ``,`` and ``:``;
* strings as UTF-8, escaping only ``"``, ``\\`` and control characters below U+0020
  (``\\b \\f \\n \\r \\t`` short forms, else ``\\u00xx`` in lower-case hex); lone
  surrogates are refused;
* integers only, in ``[-(2**53 - 1), 2**53 - 1]``; **floats are refused**. Fractional
  quantities travel as strings holding an exact rational (``"0.25"``, ``"1/3"``), see
  :func:`rational_to_str`;
* ``true``, ``false``, ``null``.

Anyone with a JSON parser can rebuild these bytes: parse, drop the signature member,
serialise with sorted keys and no whitespace.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from holedger.errors import CanonicalError

MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 64

JSONValue = Any


def _check(value: JSONValue, depth: int, path: str) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalError(f"value nested deeper than {MAX_DEPTH} levels at {path}")
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str):
            _check_str(value, path)
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise CanonicalError(f"integer out of the exact JSON range at {path}")
        return
    if isinstance(value, float):
        raise CanonicalError(
            f"float at {path}: holedger signs no floats",
            hint="carry fractions as exact rational strings (holedger.schemas.canonical)",
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalError(f"non-string object key {key!r} at {path}")
            _check_str(key, path)
            _check(item, depth + 1, f"{path}.{key}")
        return
    if isinstance(value, Sequence):
        for index, item in enumerate(value):
            _check(item, depth + 1, f"{path}[{index}]")
        return
    raise CanonicalError(f"value of type {type(value).__name__} at {path} is not JSON")


def has_utf8_form(text: str) -> bool:
    """True when ``text`` holds no lone surrogate, so canonical JSON can hold it."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_str(text: str, path: str) -> None:
    if not has_utf8_form(text):
        raise CanonicalError(f"string with a lone surrogate at {path}")


def canonical_json(value: JSONValue) -> bytes:
    """Encode ``value`` as holedger canonical JSON bytes (see module docstring)."""
    fast = _encode_checked_by_parsing(value)
    if fast is not None:
        return fast
    _check(value, 0, "$")
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def _encode_checked_by_parsing(value: JSONValue) -> bytes | None:
    """The common case at C speed: a quick type walk, then one encode; None if unsure.

    The walk admits only what the rules admit (dicts with string keys, lists, strings,
    exact integers, booleans, null) to a bounded depth; the encode refuses lone
    surrogates. Anything else (floats, tuples, other types, deep nesting) takes the
    checking path, which accepts or refuses it with a precise message.
    """
    if not plain_json(value):
        return None
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
        return None


def plain_json(value: JSONValue, depth: int = 0, *, ordered: bool = False) -> bool:
    """True when ``value`` holds only what canonical JSON admits: dicts with string keys,
    lists, strings, exact integers, booleans and null, at most MAX_DEPTH deep (``depth``
    is where ``value`` sits). With ``ordered``, every dict's keys must also already be in
    code-point order, as in a parsed canonical text."""
    kind = type(value)
    if kind is dict:
        if depth >= MAX_DEPTH:
            return False
        names = list(value)
        for key in names:
            if type(key) is not str:
                return False
        if ordered and names != sorted(names):
            return False
        return _plain_items(value.values(), depth + 1, ordered)
    if kind is list:
        return depth < MAX_DEPTH and _plain_items(value, depth + 1, ordered)
    return _plain_items((value,), depth, ordered)


def _plain_items(items: Iterable[JSONValue], depth: int, ordered: bool) -> bool:
    for item in items:
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                continue
            return False
        if (kind is dict or kind is list) and plain_json(item, depth, ordered=ordered):
            continue
        return False
    return True


def _reject_float(token: str) -> Any:
    raise CanonicalError(f"float {token} in canonical JSON", hint="floats are never signed")


def _reject_constant(token: str) -> Any:
    raise CanonicalError(f"non-JSON constant {token} in canonical JSON")


# Any integer outside the exact range has at least 16 digits; text without such a run of
# digits can be parsed without a per-integer callback. (Mapping every digit to "0" and
# searching for sixteen of them is far quicker than a regular expression here.)
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_SIXTEEN_DIGITS = b"0" * 16


def has_long_digits(data: bytes) -> bool:
    """True when ``data`` has a run of 16 or more decimal digits: only then can it hold an
    integer outside the exact range (a cheap test; digits inside strings count too)."""
    return _SIXTEEN_DIGITS in data.translate(_DIGITS_TO_ZERO)


def _exact_int(token: str) -> int:
    value = int(token)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise CanonicalError(f"integer {token[:24]} out of the exact JSON range")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise CanonicalError(f"duplicate member name {key!r}")
        result[key] = value
    return result


def parse_json(data: bytes) -> JSONValue:
    """Parse JSON strictly: UTF-8, no floats, no NaN, no duplicate names."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CanonicalError("bytes are not UTF-8") from exc
    int_hook = _exact_int if has_long_digits(data) else None
    try:
        return json.loads(
            text,
            parse_float=_reject_float,
            parse_int=int_hook,
            parse_constant=_reject_constant,
            object_pairs_hook=_no_duplicates,
        )
    except CanonicalError:
        raise
    except (ValueError, RecursionError) as exc:
        raise CanonicalError(f"not valid JSON: {exc}") from exc


def parse_canonical(data: bytes) -> JSONValue:
    """Parse bytes that must already be canonical; refuse any other spelling."""
    value = parse_json(data)
    # parse_json already refused floats, NaN, duplicate names and out-of-range integers,
    # so re-encoding needs no value walk; a lone surrogate fails the UTF-8 encode.
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        again = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalError("string with a lone surrogate") from exc
    if again != data:
        raise CanonicalError("bytes are valid JSON but not in canonical form")
    return value


def rational_to_str(value: Fraction | int) -> str:
    """The one exact string of a rational: an integer or decimal when exact, else ``p/q``.

    ``Fraction(1, 4)`` is ``"0.25"``, ``Fraction(1, 3)`` is ``"1/3"``, ``2`` is ``"2"``.
    """
    frac = Fraction(value)
    if frac.denominator == 1:
        return str(frac.numerator)
    den = frac.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return f"{frac.numerator}/{frac.denominator}"
    places = max(twos, fives)
    scaled = frac * 10**places
    assert scaled.denominator == 1
    sign = "-" if scaled < 0 else ""
    digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def str_to_rational(text: str) -> Fraction:
    """Parse the string form written by :func:`rational_to_str` and refuse any other."""
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError) as exc:
        raise CanonicalError(f"not an exact rational: {text!r}") from exc
    if rational_to_str(value) != text:
        raise CanonicalError(
            f"rational {text!r} is not in canonical form (expected {rational_to_str(value)!r})"
        )
    return value


def b64decode_strict(text: str | bytes) -> bytes | None:
    """Standard base64 decoded, or None when ``text`` is not base64: a character outside
    the alphabet (a non-ASCII one included, which the standard library refuses with a
    ValueError of its own rather than binascii.Error) or bad padding."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error is one
        return None
