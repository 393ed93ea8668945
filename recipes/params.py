"""Typed recipe parameters: reading and setting a params dataclass's fields by dotted path,
with values parsed from text by each field's declared type.

``eclectus run --param FIELD=VALUE`` and ``eclectus eval --set/--sweep`` share this, so a
value means the same in both: ``"4"`` is 4 for an ``int`` field and 4.0 for a ``float``
field, ``"none"`` is None only where the field allows None, a ``bool`` takes
true/false/yes/no/on/off/1/0, and anything else is a ValueError that names the field and the
type it expects. A dotted path (``background.chunk_tokens``) reaches a nested params
dataclass.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

PLAIN_TYPES = (bool, int, float, str)  # what text can be parsed as
TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})


@functools.cache
def field_types(params_type: type) -> dict[str, Any]:
    """Field name -> declared type of a dataclass, string annotations resolved (pure)."""
    hints = typing.get_type_hints(params_type)
    return {f.name: hints[f.name] for f in dataclasses.fields(params_type)}


def _members(declared: Any) -> tuple[list[Any], bool]:
    """The non-None members of a (possibly optional) union, and whether None is allowed."""
    if typing.get_origin(declared) in (typing.Union, types.UnionType):
        members = list(typing.get_args(declared))
    else:
        members = [declared]
    allows_none = type(None) in members
    return [m for m in members if m is not type(None)], allows_none


def _nested_type(declared: Any) -> type | None:
    """The params dataclass a field holds (``X`` or ``X | None``), else None (pure)."""
    members, _ = _members(declared)
    nested = [m for m in members if dataclasses.is_dataclass(m)]
    return nested[0] if len(nested) == 1 and isinstance(nested[0], type) else None


def _check_field(owner: type, name: str) -> Any:
    """The declared type of ``owner``'s field ``name``; ValueError naming the known fields."""
    known = field_types(owner)
    if name not in known:
        raise ValueError(f"{owner.__name__} has no field {name!r}; fields are {', '.join(known)}")
    return known[name]


def resolve(params_type: type, path: str) -> tuple[type, str]:
    """The dataclass that owns the last field of dotted ``path``, and that field's name
    (pure; ValueError naming the known fields when a part is unknown or holds no fields)."""
    *heads, name = path.split(".")
    owner = params_type
    for head in heads:
        nested = _nested_type(_check_field(owner, head))
        if nested is None:
            raise ValueError(f"{owner.__name__}.{head} has no fields: {path!r} goes too deep")
        owner = nested
    _check_field(owner, name)
    return owner, name


def _expected(members: list[Any], allows_none: bool) -> str:
    names = [getattr(m, "__name__", str(m)) for m in members]
    return " or ".join(names + (["none"] if allows_none else []))


def _convert(kind: type, text: str) -> Any:
    """``text`` as one of PLAIN_TYPES; ValueError when it is not one (pure)."""
    if kind is not bool:
        return kind(text)
    word = text.strip().lower()
    if word not in TRUE_WORDS | FALSE_WORDS:
        raise ValueError(text)
    return word in TRUE_WORDS


def parse_field(params_type: type, path: str, text: str) -> Any:
    """``text`` as the declared type of the field at dotted ``path`` of ``params_type``
    (pure). ValueError naming the field and the expected type when ``text`` is not one."""
    owner, name = resolve(params_type, path)
    members, allows_none = _members(field_types(owner)[name])
    if allows_none and text.strip().lower() == "none":
        return None
    if _nested_type(field_types(owner)[name]) is not None:
        takes = "none, or its fields as " if allows_none else "its fields as "
        raise ValueError(f"{owner.__name__}.{name} takes {takes}{path}.FIELD, got {text!r}")
    if any(kind not in PLAIN_TYPES for kind in members):
        raise ValueError(f"{owner.__name__}.{name} cannot be set from text")
    for kind in members:
        try:
            return _convert(kind, text)
        except ValueError:
            continue
    expected = _expected(members, allows_none)
    raise ValueError(f"{owner.__name__}.{name} expects {expected}, got {text!r}")


def replace_path(params: Any, path: str, value: Any) -> Any:
    """``params`` with the field at dotted ``path`` set to ``value`` (pure; the dataclasses
    validate; ValueError for an unknown field or a None on the way)."""
    head, _, rest = path.partition(".")
    resolve(type(params), head)
    if rest:
        inner = getattr(params, head)
        if inner is None:
            raise ValueError(f"{type(params).__name__}.{head} is None: cannot set {path!r}")
        value = replace_path(inner, rest, value)
    return dataclasses.replace(params, **{head: value})


def set_from_text(params: Any, path: str, text: str) -> Any:
    """``params`` with the field at dotted ``path`` set to ``text`` parsed by its declared
    type (pure; ValueError as in :func:`parse_field` and :func:`replace_path`)."""
    return replace_path(params, path, parse_field(type(params), path, text))
