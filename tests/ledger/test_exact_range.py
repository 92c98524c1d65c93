"""Every integer an event can hold is refused outside the exact JSON range when the
model is built, so no event that validated can fail to encode."""

from __future__ import annotations

import typing
from typing import Annotated, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from holedger.schemas.canonical import MAX_SAFE_INTEGER, canonical_json
from holedger.schemas.events import EVENT_TYPES, GatewayCall, TokenUsage
from holedger.schemas.types import exact_count


def _int_fields(model: type[BaseModel], seen: set[type] | None = None) -> list[tuple[str, Any]]:
    """(model.field, annotation) of every field whose type holds an int somewhere."""
    seen = seen if seen is not None else set()
    if model in seen:
        return []
    seen.add(model)
    found: list[tuple[str, Any]] = []
    for name, info in model.model_fields.items():
        annotation = (
            Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        )
        if int in _flatten(info.annotation):
            found.append((f"{model.__name__}.{name}", annotation))
        for arg in _flatten(info.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                found += _int_fields(arg, seen)
    return found


def _flatten(annotation: Any) -> list[Any]:
    out = [annotation]
    for arg in typing.get_args(annotation):
        out += _flatten(arg)
    return out


INT_FIELDS = sorted(
    {name: ann for model in EVENT_TYPES.values() for name, ann in _int_fields(model)}.items()
)


def _shapes(value: int) -> list[Any]:
    return [value, {"dev": value}, {"memory_mb": value}]


def _accepts(annotation: Any, value: int) -> bool:
    adapter = TypeAdapter(annotation)
    for shape in _shapes(value):
        try:
            adapter.validate_python(shape)
            return True
        except ValidationError:
            continue
    return False


def test_every_integer_field_is_found() -> None:
    names = {name for name, _ in INT_FIELDS}
    assert {"GatewayCall.reserved", "TokenUsage.total", "GatewayBudgetState.cap"} <= names
    assert "TrialCompleted.limits" in names and "TaskTerms.split_sizes" in names


@pytest.mark.parametrize(("name", "annotation"), INT_FIELDS, ids=[n for n, _ in INT_FIELDS])
def test_each_integer_field_refuses_the_inexact_range(name: str, annotation: Any) -> None:
    assert _accepts(annotation, 1), name
    assert _accepts(annotation, MAX_SAFE_INTEGER), name
    for bad in (MAX_SAFE_INTEGER + 1, 2**64, 2**200, -(2**53), -(2**200)):
        assert not _accepts(annotation, bad), f"{name} accepted {bad}"


@given(st.integers(min_value=-(2**200), max_value=2**200))
def test_a_gateway_call_holds_only_encodable_numbers(value: int) -> None:
    fields: dict[str, Any] = {
        "call_id": "c",
        "scope": "target",
        "model_requested": "m",
        "model_served": "m",
        "allowed": True,
        "status": 200,
        "tokens": TokenUsage(),
        "reserved": 0,
        "latency_ms": 0,
        "request_digest": None,
        "response_digest": None,
    }
    try:
        event = GatewayCall(**{**fields, "reserved": value})
    except ValidationError:
        assert not 0 <= value <= MAX_SAFE_INTEGER
        with pytest.raises(ValueError, match="reserved"):
            exact_count(value, "reserved")
        return
    assert exact_count(value, "reserved") == value
    canonical_json(event.model_dump(mode="json"))  # never raises for a built event
