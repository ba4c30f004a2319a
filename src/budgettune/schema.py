"""Declared schemas (pydantic models of the files users write: study files, pins) and their
one-line errors.

A model declares each key once: its type, range or choices (`OneOf`), finiteness. `first_problem`
validates values against it and names the first bad key with what the key allows, in words read
off the key's JSON schema (`allowed`), so no message repeats a range the model declares.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import core_schema


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """The first key of some values that its model refuses."""

    key: str
    """The key (of the model's top level)."""
    allowed: str
    """What the key allows, in words: ``an integer >= 0``."""
    missing: bool
    """Whether the key is required and absent."""


def first_problem(model: type[BaseModel], values: Mapping[str, Any]) -> Problem | None:
    """Validate ``values`` against ``model``: None when they pass, else the first bad key."""
    try:
        model.model_validate(dict(values))
    except ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][0])
        return Problem(
            key=key,
            allowed=allowed(_properties(model)[key]),
            missing=error["type"] == "missing" and len(error["loc"]) == 1,  # not a nested key
        )
    return None


@functools.cache
def _properties(model: type[BaseModel]) -> Mapping[str, Any]:
    """The JSON schema of each key of ``model`` (made once: it takes milliseconds)."""
    return model.model_json_schema()["properties"]


class OneOf:
    """``Annotated[str, OneOf(choices)]``: a string from ``choices`` (a JSON-schema enum)."""

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.literal_schema(list(self.choices))


def allowed(schema: Mapping[str, Any]) -> str:
    """What a JSON schema allows, in words: ``an integer >= 0``, ``one of dp, greedy``."""
    if "allowed" in schema:
        return str(schema["allowed"])
    if "anyOf" in schema:
        return " or ".join(allowed(s) for s in schema["anyOf"] if s.get("type") != "null")
    if "enum" in schema or "const" in schema:
        return "one of " + ", ".join(str(c) for c in schema.get("enum", [schema.get("const")]))
    kind = str(schema.get("type"))
    if kind == "array":
        count = schema.get("minItems", 0)
        size = f"{count} " if count == schema.get("maxItems") else "one or more " if count else ""
        return f"a list of {size}" + _plural(schema.get("items", {}))
    words = {
        "integer": "an integer",
        "number": "a finite number",
        "string": "a non-empty string" if schema.get("minLength") else "a string",
        "boolean": "true or false",
        "object": "a table",
    }
    return words.get(kind, kind) + _bounds(schema)


def _plural(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "of " + ", ".join(str(c) for c in schema["enum"])
    words = {"integer": "integers", "number": "finite numbers", "string": "strings"}
    return words.get(schema.get("type", ""), "values") + _bounds(schema)


def _bounds(schema: Mapping[str, Any]) -> str:
    signs = (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("exclusiveMaximum", "<"),
    )
    parts = [f"{sign} {_number(schema[name])}" for name, sign in signs if name in schema]
    return (" " + " and ".join(parts)) if parts else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
