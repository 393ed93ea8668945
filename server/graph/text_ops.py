"""The text ops: Python's own operations on ``str``, evaluated on the server.

The Python evaluator (adapters/pyeval) lowers an app's ``reply.strip()``, ``text[:200]``,
``f"{x!r}"``, ``response.joke`` (a field of a structured output) or ``items[choice.id]``
to these ops, so their result must be byte-identical to what the app's Python computes on
the client: each op below *is* that Python expression over the input texts
(tests/server/graph/test_text_ops.py checks each against Python with hypothesis). An op's
output size is bounded before it is built (``max_chars``), as the join ops' are.
"""

from __future__ import annotations

import json
import re
from typing import Any

from eclectus.protocol import OpSpec

# What LangChain's JSON parsers strip around a reply before ``json.loads(strict=False)``
# (langchain_core.utils.json._json_strip_chars): a constrained reply is plain JSON, so
# that is the whole parse.
JSON_STRIP_CHARS = " \n\r\t`"
# ``format(s, spec)`` for a str: [[fill]align][width][.precision][s]; anything else Python
# refuses for a str (sign, '#', '0', grouping, another type), and the client checks the
# spec with Python before sending it.
_STR_SPEC = re.compile(r"(?:.?[<>^])?(?P<width>\d*)(?:\.(?P<precision>\d+))?s?", re.DOTALL)
# str.lower/upper change a character into at most 3 (Unicode SpecialCasing, e.g. 'ΐ'.upper())
MAX_CASE_EXPANSION = 3
MAX_REPR_EXPANSION = 10  # '\U0010ffff' is ten characters for one


class TextOpFailed(Exception):
    """The op cannot produce a text (the message says why); its output fails."""


def output_bound(op: OpSpec, texts: list[str]) -> int:
    """An upper bound of the op's output length, computed without building it (pure)."""
    size = len(texts[0]) if texts else 0
    if op.op in ("lower", "upper"):
        return size * MAX_CASE_EXPANSION
    if op.op == "repr":
        return size * MAX_REPR_EXPANSION + 2
    if op.op == "index":
        return max(map(len, texts[1:]))
    if op.op == "replace":
        old, new = str(op.args[0]), str(op.args[1])
        count = texts[0].count(old) if old else size + 1
        if len(op.args) == 3 and isinstance(op.args[2], int) and op.args[2] >= 0:
            count = min(count, op.args[2])
        return size + count * max(len(new) - len(old), 0)
    if op.op == "format":
        match = _STR_SPEC.fullmatch(str(op.args[0]))
        width = int(match.group("width") or 0) if match else 0
        return max(size, width)
    return size  # json_field, slice and the strips never grow the text


def run_text_op(op: OpSpec, texts: list[str]) -> str:
    """The op's output for its inputs' texts (pure); TextOpFailed when Python would not
    give a string (a JSON field that is no string or integer, an index out of range)."""
    text = texts[0]
    args = op.args
    if op.op == "json_field":
        return _json_field(text, op.path)
    if op.op == "index":
        return _index(text, texts[1:])
    if op.op in ("strip", "lstrip", "rstrip"):
        chars = args[0] if args else None
        return str(getattr(text, op.op)(chars))
    if op.op == "lower":
        return text.lower()
    if op.op == "upper":
        return text.upper()
    if op.op == "replace":
        count = args[2] if len(args) == 3 else -1
        return text.replace(str(args[0]), str(args[1]), int(count))  # type: ignore[arg-type]
    if op.op == "slice":
        return text[slice(*args)]
    if op.op == "format":
        if _STR_SPEC.fullmatch(str(args[0])) is None:
            raise TextOpFailed(f"format spec {args[0]!r} is not a string format spec")
        return format(text, str(args[0]))
    if op.op == "repr":
        return repr(text)
    raise TextOpFailed(f"unknown text op {op.op!r}")  # the frame's Literal forbids it


def _json_field(text: str, path: list[str | int]) -> str:
    try:
        value: Any = json.loads(text.strip(JSON_STRIP_CHARS), strict=False)
    except ValueError as exc:
        raise TextOpFailed(f"the input is not JSON ({exc})") from exc
    for key in path:
        if not _has(value, key):
            raise TextOpFailed(f"the JSON has no {key!r} at {path}")
        value = value[key]
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TextOpFailed(f"the JSON value at {path} is a {type(value).__name__}, not a string")


def _index(index_text: str, items: list[str]) -> str:
    try:
        index = int(index_text)
    except ValueError as exc:
        raise TextOpFailed(f"index {index_text[:32]!r} is not an integer") from exc
    if not -len(items) <= index < len(items):
        raise TextOpFailed(f"list index {index} out of range for {len(items)} item(s)")
    return items[index]


def _has(value: Any, key: str | int) -> bool:
    """Whether ``value[key]`` is a JSON object's key or a list's index (pure)."""
    if isinstance(key, str):
        return isinstance(value, dict) and key in value
    return isinstance(value, list) and -len(value) <= key < len(value)
