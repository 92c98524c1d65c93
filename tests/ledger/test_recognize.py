"""schemas.recognize builds a payload pattern only for models inside its small language.

Anything outside (floats, free-form dicts, unions, aliases, constraints other than ge=0,
validators and serialisers of one's own, defaults made by factories, computed fields,
extra members allowed, ...) must give no pattern at all, so that such payloads are always
validated by pydantic. Inside it, the pattern must match the canonical JSON of valid
payloads and nothing the model refuses (the whole-record differential tests are in
test_record_pattern.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    computed_field,
    field_validator,
    model_validator,
)

from holedger.schemas.canonical import canonical_json
from holedger.schemas.events import Model
from holedger.schemas.recognize import payload_pattern
from holedger.schemas.types import KeyIdHex, Rational, Sha256Hex


class Plain(Model):
    name: str
    count: int = Field(ge=0)
    delta: int
    flag: bool
    maybe: str | None
    scope: Literal["target", "optimizer"]
    tags: list[str]
    digest: Sha256Hex
    key: KeyIdHex | None = None


class Item(Model):
    n: int = Field(ge=0)


class Outer(Model):
    inner: Plain
    items: list[Item]


def test_models_inside_the_language_get_a_pattern_that_matches_their_canonical_json() -> None:
    plain = Plain(
        name="a b/c",
        count=3,
        delta=-4,
        flag=True,
        maybe=None,
        scope="target",
        tags=["x", ""],
        digest="ab" * 32,
        key="0a1b2c3d",
    )
    for model, value in ((Plain, plain), (Outer, Outer(inner=plain, items=[Item(n=1), Item(n=0)]))):
        pattern = payload_pattern(model)
        assert pattern is not None, model
        assert pattern.fullmatch(canonical_json(value.model_dump(mode="json")))


def _float() -> type[BaseModel]:
    class M(Model):
        x: float

    return M


def _validator() -> type[BaseModel]:
    class M(Model):
        x: str

        @field_validator("x")
        @classmethod
        def lower(cls, v: str) -> str:
            return v.lower()

    return M


def _model_validator() -> type[BaseModel]:
    class M(Model):
        x: int

        @model_validator(mode="after")
        def check(self) -> Any:
            return self

    return M


def _computed() -> type[BaseModel]:
    class M(Model):
        x: int

        @computed_field  # type: ignore[prop-decorator]
        @property
        def y(self) -> int:
            return self.x

    return M


def _extra_allowed() -> type[BaseModel]:
    class M(BaseModel):
        model_config = ConfigDict(extra="allow")
        x: int

    return M


def _simple(annotation: Any, default: Any = ...) -> type[BaseModel]:
    namespace: dict[str, Any] = {"__annotations__": {"x": annotation}}
    if default is not ...:
        namespace["x"] = default
    return type("M", (Model,), namespace)


OUTSIDE: dict[str, Any] = {
    "a float": _float,
    "a free-form dict": lambda: _simple(dict[str, Any]),
    "Any": lambda: _simple(Any),
    "a union": lambda: _simple(str | int),
    "an alias": lambda: _simple(str, Field(alias="y")),
    "a serialisation alias": lambda: _simple(str, Field(serialization_alias="y")),
    "min_length": lambda: _simple(str, Field(min_length=1)),
    "a string pattern": lambda: _simple(str, Field(pattern="^a$")),
    "le": lambda: _simple(int, Field(le=5)),
    "ge=1": lambda: _simple(int, Field(ge=1)),
    "gt": lambda: _simple(int, Field(gt=0)),
    "a default factory": lambda: _simple(list[str], Field(default_factory=list)),
    "a field validator": _validator,
    "a model validator": _model_validator,
    "another before-validator": lambda: _simple(Annotated[str, BeforeValidator(str.strip)]),
    "an after-validator": lambda: _simple(Annotated[str, AfterValidator(str.strip)]),
    "a serialiser": lambda: _simple(Annotated[int, PlainSerializer(str, return_type=str)]),
    "a computed field": _computed,
    "extra members allowed": _extra_allowed,
    "an exact rational": lambda: _simple(Rational),
    "an integer literal": lambda: _simple(Literal[1, 2]),
    "a literal that needs escaping": lambda: _simple(Literal['a"b']),
    "a nested model outside": lambda: _simple(_float()),
    "a list of floats": lambda: _simple(list[float]),
    "bytes": lambda: _simple(bytes),
    "one model used twice (core-schema definitions)": lambda: _simple(tuple[Item, Item]),
}


@pytest.mark.parametrize("what", sorted(OUTSIDE))
def test_models_outside_the_language_get_no_pattern(what: str) -> None:
    assert payload_pattern(OUTSIDE[what]()) is None, what


def test_a_model_without_fields_gets_no_pattern() -> None:
    class Empty(Model):
        pass

    assert payload_pattern(Empty) is None
