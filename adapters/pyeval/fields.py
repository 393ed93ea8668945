"""What a structured output's fields are, before the reply exists.

``model.with_structured_output(Joke).invoke(...)`` is a ``SymParsed``: the constrained
reply, parsed on the client where the value is needed. App code then reads
``response.joke`` or ``parsed["steps"][0]``. The evaluator keeps such a read symbolic (a
``SymParsed`` with a longer ``path``; the server reads it with the ``json_field`` op) only
when the result is provably what the eager parse would give:

- the parser is exactly ``PydanticOutputParser`` over a model whose parse cannot change a
  value (model_routes.exact_model: no validators, aliases, string settings), read by
  attribute; or exactly ``JsonOutputParser`` over a JSON Schema, read by key;
- every step is a *required* field (or a list index within the schema's ``minItems``), so
  the eager read cannot raise, and the leaf is a string or an integer (the JSON text of a
  string is that string; of an integer, ``str()`` of it).

:func:`step` answers None for anything else, and the evaluator fetches the reply (a graph
break) and reads it in Python, which raises what Python raises.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, replace
from typing import Any, Literal

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from pydantic import BaseModel

from eclectus.adapters.langchain.compiler.symbols import SymParsed

Kind = Literal["str", "int", "list", "model", "object"]
_CONSTRAINTS = frozenset({"MinLen", "MaxLen", "Ge", "Le", "Gt", "Lt", "Interval"})


@dataclass(frozen=True, slots=True)
class Shape:
    """The provable Python type of a parsed value: ``kind``, the JSON Schema there, and
    for a model its class, for a list its items' shape."""

    kind: Kind
    schema: dict[str, Any]
    model: type[BaseModel] | None = None
    item: Shape | None = None

    @property
    def min_items(self) -> int:
        return int(self.schema.get("minItems", 0))

    @property
    def max_items(self) -> int | None:
        found = self.schema.get("maxItems")
        return None if found is None else int(found)


def shape(value: SymParsed) -> Shape | None:
    """The shape of ``value`` (a whole reply or a field of one); None when unknown."""
    root = _root(value)
    if root is None:
        return None
    current: Shape | None = root
    for key in value.path:
        current = _child(current, key, value.schema or {}) if current else None
    return current


def step(value: SymParsed, key: str | int, by: Literal["attr", "item"]) -> SymParsed | None:
    """``value.key`` (``by="attr"``) or ``value[key]``, still symbolic, when the eager read
    provably gives the reply's JSON there; None otherwise (the caller fetches)."""
    here = shape(value)
    if here is None:
        return None
    if by == "attr" and (here.kind != "model" or not isinstance(key, str)):
        return None
    if by == "item" and here.kind == "model":
        return None
    child = _child(here, key, value.schema or {})
    if child is None:
        return None
    return replace(value, path=(*value.path, key))  # type: ignore[arg-type]


def leaf(value: SymParsed) -> Literal["str", "int"] | None:
    """Whether ``value`` is provably a ``str`` or an ``int`` (a leaf the server reads)."""
    found = shape(value)
    return found.kind if found is not None and found.kind in ("str", "int") else None  # type: ignore[return-value]


def int_bounds(value: SymParsed) -> tuple[int, int] | None:
    """The schema's (minimum, maximum) of an integer field, when it gives both."""
    found = shape(value)
    if found is None or found.kind != "int":
        return None
    low, high = found.schema.get("minimum"), found.schema.get("maximum")
    if isinstance(low, int) and isinstance(high, int):
        return low, high
    return None


def python_type(value: SymParsed) -> type | None:
    """The eager value's exact type, when provable (for ``isinstance``)."""
    found = shape(value)
    if found is None:
        return None
    types = {"str": str, "int": int, "list": list, "object": dict}
    return found.model if found.kind == "model" else types[found.kind]


def exact_model(value: SymParsed) -> type[BaseModel] | None:
    """The model a Pydantic parse provably leaves each field of (model_routes.py)."""
    from eclectus.adapters.langgraph.model_routes import exact_model as exact

    return exact(value)


def _root(value: SymParsed) -> Shape | None:
    schema = value.schema
    if schema is None or '"action_input"' in json.dumps(schema):
        return None  # LangChain's parser rewrites that key's text before parsing it
    if type(value.parser) is PydanticOutputParser:
        model = exact_model(replace(value, path=()))
        return Shape("model", schema, model=model) if model is not None else None
    if type(value.parser) is JsonOutputParser:
        return _from_schema(schema, schema)
    return None


def _child(here: Shape, key: str | int, root: dict[str, Any]) -> Shape | None:
    schema = _resolve(here.schema, root)
    if here.kind == "model" and isinstance(key, str):
        assert here.model is not None
        field = here.model.model_fields.get(key)
        props = schema.get("properties", {})
        if field is None or not field.is_required() or key not in schema.get("required", ()):
            return None
        if any(type(m).__name__ not in _CONSTRAINTS for m in field.metadata):
            return None
        return _from_annotation(field.annotation, _resolve(props.get(key, {}), root), root)
    if here.kind == "object" and isinstance(key, str):
        if key not in schema.get("required", ()) or key not in schema.get("properties", {}):
            return None
        return _from_schema(schema["properties"][key], root)
    if here.kind == "list" and isinstance(key, int) and here.item is not None:
        within = 0 <= key < here.min_items or -here.min_items <= key < 0
        return here.item if within else None
    return None


def _from_annotation(annotation: Any, schema: dict[str, Any], root: dict[str, Any]) -> Shape | None:
    if annotation is str:
        return Shape("str", schema) if schema.get("type") == "string" else None
    if annotation is int:
        return Shape("int", schema) if schema.get("type") == "integer" else None
    if typing.get_origin(annotation) is typing.Literal:
        literals = typing.get_args(annotation)
        return Shape("str", schema) if all(type(a) is str for a in literals) else None
    if typing.get_origin(annotation) is list:
        (item_type,) = typing.get_args(annotation) or (None,)
        items = _resolve(schema.get("items", {}), root)
        item = _from_annotation(item_type, items, root) if item_type is not None else None
        return Shape("list", schema, item=item) if item is not None else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        probe = SymParsed(None, PydanticOutputParser(pydantic_object=annotation), schema)  # type: ignore[arg-type]
        model = exact_model(probe)
        return Shape("model", schema, model=model) if model is not None else None
    return None


def _from_schema(schema: dict[str, Any], root: dict[str, Any]) -> Shape | None:
    schema = _resolve(schema, root)
    kind = schema.get("type")
    if kind == "string" and not schema.get("format"):
        return Shape("str", schema)
    if kind == "integer":
        return Shape("int", schema)
    if kind == "object":
        return Shape("object", schema)
    if kind == "array" and isinstance(schema.get("items"), dict):
        item = _from_schema(schema["items"], root)
        return Shape("list", schema, item=item) if item is not None else None
    return None


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with a local ``$ref`` (``#/$defs/X``) or a one-item ``allOf`` followed."""
    for _ in range(16):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            schema = target if isinstance(target, dict) else {}
            continue
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
            schema = all_of[0]
            continue
        return schema
    return {}
