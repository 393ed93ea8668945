"""Pydantic routers as server switches: when a parsed model's field is provably a literal.

``model.with_structured_output(Route)``, ``Route`` a Pydantic class, parses the constrained
reply with ``PydanticOutputParser``: ``Route.model_validate`` of the JSON. The value the
eager run routes on is then the model's field, not the JSON's; the two agree exactly when
nothing between them can change it. This module admits a model only when that is provable:

- the parser is exactly ``PydanticOutputParser`` over a Pydantic v2 model with no
  validators of any kind (field, model, root) and no ``model_post_init``;
- no field has an alias (the JSON key would differ from the attribute) and the model does
  not allow extra keys;
- the routed field is required, annotated ``Literal`` of strings or a ``str``-valued
  ``Enum`` (no ``Annotated`` metadata), and the reply's schema pins the same literals;
- no setting that changes or refuses a string (``strict``, ``str_to_lower``...).

Two shapes are switched. A node returning the model (``add_node("router", router)``):
LangGraph writes each field that names a state key (``get_update_as_tuples``), so
:func:`split_model` keeps each such field symbolic under its key. A node writing the model
to one key (``{"route": router}``, the edge reading ``s["route"].next``): the edge is
evaluated ahead of time on :func:`known_model`, a ``Route`` holding only the routed field,
any other read raising. Anything else stays the client cut (always exact). Pure.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import replace
from enum import Enum
from functools import cache
from typing import Any

from langchain_core.output_parsers import PydanticOutputParser
from pydantic import BaseModel

from eclectus.adapters.langchain.compiler.symbols import SymParsed
from eclectus.protocol.schema_enum import NotPinned, pinned_literals

# settings under which validating the reply's JSON may change a string or refuse it
_CHANGING_CONFIG = (
    "alias_generator",
    "strict",
    "str_to_lower",
    "str_to_upper",
    "str_strip_whitespace",
)


class UnknownField(Exception):
    """A routing function read a part of a model the client does not know yet."""


def exact_model(value: Any) -> type[BaseModel] | None:
    """The model class ``value`` (a SymParsed) parses to, when parsing cannot change a
    field's value (see the module); None otherwise."""
    if not isinstance(value, SymParsed) or type(value.parser) is not PydanticOutputParser:
        return None
    cls = value.parser.pydantic_object
    if not isinstance(cls, type) or not issubclass(cls, BaseModel):
        return None  # a pydantic.v1 model
    found = cls.__pydantic_decorators__
    if found.validators or found.field_validators or found.root_validators:
        return None
    if found.model_validators or cls.__pydantic_post_init__ is not None:
        return None
    config = cls.model_config
    if config.get("extra") == "allow" or any(config.get(k) for k in _CHANGING_CONFIG):
        return None
    fields = cls.model_fields.values()
    if any(f.alias or f.validation_alias for f in fields):
        return None
    return cls


def split_model(output: SymParsed, channels: Mapping[str, Any]) -> dict[str, SymParsed] | None:
    """A whole parsed model as LangGraph writes it to the state: one symbolic field per
    field that names a channel, when every field is required (LangGraph skips a None
    that equals a default) and no channel names another attribute of the class (eager
    would write that attribute). None otherwise."""
    cls = exact_model(output)
    if cls is None or output.path:
        return None
    fields = cls.model_fields
    if not all(f.is_required() for f in fields.values()):
        return None
    if any(k not in fields and hasattr(cls, k) for k in channels):
        return None
    return {k: replace(output, path=(k,)) for k in fields if k in channels}


def field_literals(value: SymParsed) -> tuple[str, ...] | None:
    """The literals a model's field (``value.path``, one key) is by construction; None
    when the field is not provably one of them."""
    cls = exact_model(value)
    if cls is None or len(value.path) != 1 or value.schema is None:
        return None
    field = cls.model_fields.get(value.path[0])
    if field is None or not field.is_required() or field.metadata:
        return None
    allowed = _annotation_literals(field.annotation)
    try:
        pinned = pinned_literals(value.schema, value.path)
    except NotPinned:
        return None
    return pinned if allowed is not None and set(allowed) == set(pinned) else None


def routed_field(value: Any) -> SymParsed | None:
    """The field a whole parsed model is routed on: its first field that is provably a
    literal, as a field SymParsed; None when there is none."""
    if exact_model(value) is None or value.path:
        return None
    for name in value.parser.pydantic_object.model_fields:
        candidate = replace(value, path=(name,))
        if field_literals(candidate) is not None:
            return candidate
    return None


def field_value(value: SymParsed, literal: str) -> Any:
    """The field's eager value when the reply holds ``literal``: the string for a
    ``Literal``, the member for an ``Enum`` (pure)."""
    cls = value.parser.pydantic_object
    annotation = cls.model_fields[value.path[0]].annotation
    if _is_str_enum(annotation) and not cls.model_config.get("use_enum_values"):
        return annotation(literal)
    return literal


def known_model(field: SymParsed, literal: str) -> BaseModel:
    """A model of ``field``'s class holding only the routed field: reading any other
    field, comparing, printing or dumping it raises :class:`UnknownField` (pure)."""
    partial = _partial_class(field.parser.pydantic_object)
    model = partial.model_construct()
    object.__setattr__(model, "__dict__", {field.path[0]: field_value(field, literal)})
    return model


def literal_of(value: Any) -> Any:
    """A routed value as the switch's literal: an Enum member's value (pure)."""
    return value.value if isinstance(value, Enum) else value


def _annotation_literals(annotation: Any) -> tuple[str, ...] | None:
    if typing.get_origin(annotation) is typing.Literal:
        args = typing.get_args(annotation)
        return args if all(type(a) is str for a in args) else None
    if _is_str_enum(annotation):
        return tuple(m.value for m in annotation)
    return None


def _is_str_enum(annotation: Any) -> bool:
    return (
        isinstance(annotation, type)
        and issubclass(annotation, Enum)
        and all(type(m.value) is str for m in annotation)
    )


def _unknown(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise UnknownField("a part of the router's model the client does not know yet")


@cache
def _partial_class(cls: type[BaseModel]) -> type[BaseModel]:
    """``cls`` whose instances raise on anything but reading a field they hold."""
    blocked = ("__getattr__", "__eq__", "__iter__", "__repr__", "__str__", "__format__")
    methods = ("model_dump", "model_dump_json", "model_copy", "__copy__", "__deepcopy__")
    namespace = {name: _unknown for name in (*blocked, *methods)}
    namespace["__module__"] = cls.__module__
    return type(cls.__name__, (cls,), namespace)
