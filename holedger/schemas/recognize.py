"""Byte patterns that recognise canonical, valid payloads without building a model.

``payload_pattern(model)`` compiles a model's pydantic core schema into one regular
expression over bytes. Whatever the pattern matches is, at once:

* the canonical JSON of an object (members in code-point order, no whitespace, integers
  without sign or leading zeros beyond what canonical JSON writes, strings written as
  canonical JSON writes them), and
* a payload the model validates, whose validated value serialises back to those very
  bytes (so the strict parser and the typed fast path accept it too).

It recognises a deliberately small language, and answers None (no pattern) for any model
that uses something outside it:

* every field present, in code-point order of its name, with no alias;
* strings drawn from printable ASCII without ``"`` and ``\\`` (nothing a canonical
  encoder would escape); other strings make the pattern miss, and the caller falls back
  to validating the payload with pydantic;
* integers of at most 15 digits (below 2**53), non-negative where the field has ge=0;
  bounds no 15-digit integer reaches (the exact JSON range) are allowed, any other bound
  makes the model ineligible;
* booleans, null where the field is nullable, string literals from that alphabet, lists
  of any of these, and nested models built the same way;
* the string validators listed in ``types.EXACT_STRING_VALIDATORS``, each of which accepts
  exactly the strings of its pattern and returns them unchanged.

Custom serialisers, model or field validators (other than those listed), config options,
constraints, defaults that run on error, computed fields, unions, floats, free-form dicts
and everything else make ``payload_pattern`` return None. A miss is never an error: the
caller validates such a payload the slow way. A match must never be wrong, which
tests/schemas/test_recognize.py checks against pydantic and the canonical encoder.

Replay uses the match to accept a payload's schema and canonical form for a fraction of a
model validation's cost; the model itself is built only when something needs it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

from holedger.schemas.types import EXACT_STRING_VALIDATORS

# Printable ASCII without '"' (0x22) and '\' (0x5c): canonical JSON writes these as-is.
_PLAIN_STRING = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]*"'
_NATURAL = rb"(?:0|[1-9][0-9]{0,14})"
_INTEGER = rb"(?:0|-?[1-9][0-9]{0,14})"
_BOOL = rb"(?:true|false)"
_WIDEST = 10**15 - 1  # the largest magnitude the integer patterns match
_PLAIN_TEXT = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]*")
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Members each node type may carry; any other member makes the model ineligible.
_ALLOWED: dict[str, frozenset[str]] = {
    "model": frozenset(
        {"type", "cls", "schema", "config", "ref", "metadata", "custom_init", "root_model"}
    ),
    "model-fields": frozenset({"type", "fields", "model_name", "computed_fields", "metadata"}),
    "model-field": frozenset({"type", "schema", "metadata"}),
    "default": frozenset({"type", "schema", "default", "metadata"}),
    "nullable": frozenset({"type", "schema", "metadata"}),
    "str": frozenset({"type", "metadata"}),
    "int": frozenset({"type", "ge", "le", "metadata"}),
    "bool": frozenset({"type", "metadata"}),
    "literal": frozenset({"type", "expected", "metadata"}),
    "list": frozenset({"type", "items_schema", "metadata"}),
    "function-before": frozenset({"type", "function", "schema", "metadata"}),
}
_CONFIG_ALLOWED = frozenset({"title", "extra_fields_behavior"})


class _Ineligible(Exception):
    """The schema uses something the pattern language does not cover."""


def payload_pattern(
    model: type[BaseModel], groups: Collection[str] = ()
) -> re.Pattern[bytes] | None:
    """A pattern matching only canonical JSON of valid ``model`` payloads, or None.

    The value of each top-level field named in ``groups`` is a named group (the field's
    name), for reading that member without parsing the payload.
    """
    source = payload_source(model, groups)
    return None if source is None else re.compile(source)


def payload_source(model: type[BaseModel], groups: Collection[str] = ()) -> bytes | None:
    """The uncompiled ``payload_pattern``, to embed in a larger pattern; None if ineligible."""
    try:
        return _node(model.__pydantic_core_schema__, top=frozenset(groups))
    except _Ineligible:
        return None


def _node(node: Any, top: frozenset[str] | None = None) -> bytes:
    if not isinstance(node, dict):
        raise _Ineligible
    kind = node.get("type")
    allowed = _ALLOWED.get(kind) if isinstance(kind, str) else None
    if allowed is None or not set(node) <= allowed:
        raise _Ineligible
    if kind == "model":
        return _model(node, top)
    if kind in ("default", "model-field"):
        return _node(node["schema"])
    if kind == "nullable":
        return b"(?:null|" + _node(node["schema"]) + b")"
    if kind == "str":
        return _PLAIN_STRING
    if kind == "bool":
        return _BOOL
    if kind == "int":
        # The patterns allow at most 15 digits: a bound beyond that range excludes nothing
        # they match (the exact-JSON-range types), any tighter bound is not expressed.
        low, high = node.get("ge"), node.get("le")
        if high is not None and (type(high) is not int or high < _WIDEST):
            raise _Ineligible
        if low is None or (type(low) is int and low <= -_WIDEST):
            return _INTEGER
        if type(low) is int and low == 0:
            return _NATURAL
        raise _Ineligible
    if kind == "literal":
        return _literal(node["expected"])
    if kind == "list":
        item = _node(node["items_schema"])
        return rb"\[(?:" + item + rb"(?:," + item + rb")*)?\]"
    if kind == "function-before":
        return _exact_string(node)
    raise _Ineligible  # a node type listed in _ALLOWED but not handled above


def _model(node: dict[str, Any], top: frozenset[str] | None) -> bytes:
    if node.get("custom_init") or node.get("root_model"):
        raise _Ineligible
    config = node.get("config") or {}
    if not set(config) <= _CONFIG_ALLOWED or config.get("extra_fields_behavior") not in (
        None,
        "forbid",
        "ignore",
    ):
        raise _Ineligible
    fields_node = node["schema"]
    if not isinstance(fields_node, dict) or fields_node.get("type") != "model-fields":
        raise _Ineligible  # a model wrapped in validators
    if not set(fields_node) <= _ALLOWED["model-fields"] or fields_node.get("computed_fields"):
        raise _Ineligible
    fields: dict[str, Any] = fields_node["fields"]
    if not fields:
        raise _Ineligible
    parts = []
    for name in sorted(fields):
        if not _FIELD_NAME.fullmatch(name):
            raise _Ineligible
        value = _node(fields[name])
        if top is not None and name in top:
            value = b"(?P<" + name.encode() + b">" + value + b")"
        parts.append(b'"' + name.encode() + b'":' + value)
    return rb"\{" + b",".join(parts) + rb"\}"


def _literal(expected: Any) -> bytes:
    if not isinstance(expected, list) or not expected:
        raise _Ineligible
    options = []
    for value in expected:
        if type(value) is not str or not _PLAIN_TEXT.fullmatch(value):
            raise _Ineligible
        options.append(re.escape(value.encode()))
    return b'"(?:' + b"|".join(options) + b')"'


def _exact_string(node: dict[str, Any]) -> bytes:
    function = node["function"]
    inner = node["schema"]
    if (
        not isinstance(function, dict)
        or set(function) != {"type", "function"}
        or function["type"] != "no-info"
        or not isinstance(inner, dict)
        or {k: v for k, v in inner.items() if k != "metadata"} != {"type": "str"}
    ):
        raise _Ineligible
    try:
        pattern = EXACT_STRING_VALIDATORS.get(function["function"])
    except TypeError:  # an unhashable callable
        raise _Ineligible from None
    if pattern is None:
        raise _Ineligible
    return b'"' + pattern + b'"'
