"""``"...{}...".format(...)`` and ``"...%s..." % (...)`` over symbolic values.

A concrete template with symbolic arguments is parsed with Python's own parser
(``string.Formatter().parse``; for ``%``, the ``%s`` / ``%r`` / ``%(name)s`` / ``%%`` subset),
and each field becomes what :func:`operators.formatted` makes of its value. Anything else
a template may hold (attribute or index fields, nested specs, ``%d``, flags, widths), or a
mismatch Python would raise on, answers None: the caller fetches the arguments and lets
Python format them.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from eclectus.adapters.pyeval.operators import Ops, formatted, text_of
from eclectus.adapters.pyeval.values import TextPart, make_text

_PERCENT = re.compile(r"%(?:\((?P<key>[^()]*)\))?(?P<kind>[sr%])|%")
_CONVERSION_CODES = {None: -1, "s": 115, "r": 114, "a": 97}


def str_format(ops: Ops, template: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``template.format(*args, **kwargs)``, or None to leave it to Python."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError:
        return None
    parts: list[TextPart] = []
    auto = 0
    numbering: set[str] = set()
    for literal, name, spec, conversion in fields:
        parts.append(literal)
        if name is None:
            continue
        if (spec and "{" in spec) or conversion not in _CONVERSION_CODES:
            return None
        if name == "":
            numbering.add("auto")
            key: int | str = auto
            auto += 1
        elif name.isdigit():
            numbering.add("manual")
            key = int(name)
        elif name.isidentifier():
            key = name
        else:
            return None  # {0.attr}, {x[k]}: Python's to follow
        if len(numbering) > 1:
            return None  # mixing automatic and manual numbering: Python raises
        missing = key >= len(args) if isinstance(key, int) else key not in kwargs
        if missing:
            return None  # Python raises IndexError / KeyError
        value = args[key] if isinstance(key, int) else kwargs[key]
        field = text_of(ops, formatted(ops, value, _CONVERSION_CODES[conversion], spec or ""))
        if field is None:
            return None
        parts += field
    return make_text(parts)


def percent(ops: Ops, template: str, values: Any) -> Any:
    """``template % values`` for ``%s``, ``%r``, ``%(key)s`` and ``%%``, or None."""
    matches = list(_PERCENT.finditer(template))
    if any(m.group("kind") is None for m in matches):
        return None  # a flag, width or another conversion: Python's
    named = [m for m in matches if m.group("key") is not None]
    kinds = [m for m in matches if m.group("kind") != "%"]
    if named and len(named) != len(kinds):
        return None  # mixing named and positional: Python raises
    if named:
        if not isinstance(values, dict):
            return None
        if any(m.group("key") not in values for m in named):
            return None
    else:
        items = values if type(values) is tuple else (values,)
        if isinstance(values, dict) and not kinds:
            items = ()
        if len(items) != len(kinds):
            return None  # "not enough arguments" / "not all arguments converted"
    parts: list[TextPart] = []
    position, index = 0, 0
    for match in matches:
        parts.append(template[position : match.start()])
        position = match.end()
        kind = match.group("kind")
        if kind == "%":
            parts.append("%")
            continue
        key = match.group("key")
        value = values[key] if key is not None else items[index]
        index += key is None
        field = text_of(ops, formatted(ops, value, _CONVERSION_CODES[kind], ""))
        if field is None:
            return None
        parts += field
    parts.append(template[position:])
    return make_text(parts)
