"""The closed table: Python operators on symbolic values, as server ops or Python.

Each function takes evaluated operands. When none is symbolic it is Python's own operator
(``operator.add``, ``getattr``, ``format``...). When one is, the table either keeps the
result symbolic, with exactly Python's semantics (``+`` and f-strings on strings build a
:class:`SymText`; ``s.strip()``, ``s[:80]``, ``f"{s!r}"`` become text ops; a structured
output's field stays a field), or asks for the operands concretely (``Ops.concrete``: a
graph break) and applies Python's operator to them. Nothing here guesses.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Protocol

from eclectus.adapters.langchain.compiler.symbols import SymParsed
from eclectus.adapters.langchain.pieces import Ref, Spread, Symbolic, SymMessage
from eclectus.adapters.pyeval import fields
from eclectus.adapters.pyeval.host import Host
from eclectus.adapters.pyeval.values import Deferred, SymText, TextPart, is_symbolic, make_text

BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.MatMult: operator.matmul, ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
    ast.RShift: operator.rshift, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
}  # fmt: skip
INPLACE = {
    ast.Add: operator.iadd, ast.Sub: operator.isub, ast.Mult: operator.imul,
    ast.MatMult: operator.imatmul, ast.Div: operator.itruediv,
    ast.FloorDiv: operator.ifloordiv, ast.Mod: operator.imod, ast.Pow: operator.ipow,
    ast.LShift: operator.ilshift, ast.RShift: operator.irshift, ast.BitOr: operator.ior,
    ast.BitXor: operator.ixor, ast.BitAnd: operator.iand,
}  # fmt: skip
COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_,
    ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Invert: operator.invert}
CONVERSIONS = {-1: None, 115: str, 114: repr, 97: ascii}  # FormattedValue.conversion


class Ops(Protocol):
    """What the table needs of the evaluator: the host, and a graph break here."""

    host: Host

    def concrete(self, value: Any, reason: str) -> Any: ...


# -- strings ------------------------------------------------------------------------------


def text_of(ops: Ops, value: Any) -> list[TextPart] | None:
    """``value`` as the parts of a ``str`` (concrete text and refs), when it is one: a
    ``str``, a model's text, a SymText, a structured output's string field. None for
    anything else (pure but for declaring a field's op)."""
    if type(value) is str:
        return [value]
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, SymText):
        return list(value.parts)
    if isinstance(value, SymParsed) and fields.leaf(value) == "str":
        return [ops.host.as_ref(value)]
    return None


def is_sym_text(ops: Ops, value: Any) -> bool:
    """A symbolic ``str`` (not a concrete one)."""
    return isinstance(value, Ref | SymText) or (
        isinstance(value, SymParsed) and fields.leaf(value) == "str"
    )


def ref_of(ops: Ops, value: Any) -> Ref:
    """A symbolic string as one server variable (a join or field op when needed)."""
    return ops.host.as_ref(value)


def str_of(ops: Ops, value: Any) -> Any:
    """``str(value)``: the text of a string; an integer field's ``str``; a list of
    strings rendered by the server's ``repr_list``; else Python's, after a fetch."""
    value = ops.host.current(value)
    if not is_symbolic(value):
        return str(value)
    parts = text_of(ops, value)
    if parts is not None:
        return make_text(parts)
    if isinstance(value, SymParsed) and fields.leaf(value) == "int":
        return ops.host.as_ref(value)
    if type(value) is list and _text_list(ops, value):
        return ops.host.repr_list(_list_items(ops, value))
    return str(ops.concrete(value, "str() of a server value"))


def repr_of(ops: Ops, value: Any) -> Any:
    """``repr(value)``: ``repr`` of a string on the server; a list of strings as str()."""
    value = ops.host.current(value)
    if not is_symbolic(value):
        return repr(value)
    if is_sym_text(ops, value):
        return ops.host.text_op("repr", [ref_of(ops, value)], label="repr of a string")
    if type(value) is list and _text_list(ops, value):
        return ops.host.repr_list(_list_items(ops, value))
    return repr(ops.concrete(value, "repr() of a server value"))


def formatted(ops: Ops, value: Any, conversion: int, spec: str) -> Any:
    """``f"{value!c:spec}"``'s text (as Python formats it: ``format(conv(value), spec)``,
    and ``format(v, "")`` is ``str(v)``)."""
    value = ops.host.current(value)
    convert = CONVERSIONS.get(conversion)
    if not is_symbolic(value):
        return format(convert(value) if convert else value, spec)
    if convert is repr:
        text = repr_of(ops, value)
    elif convert is str or (convert is None and not spec):
        text = str_of(ops, value)
    elif convert is None and is_sym_text(ops, value):
        text = value
    else:
        value = ops.concrete(value, "formatting a server value")
        return format(convert(value) if convert else value, spec)
    if not spec:
        return text
    if not is_symbolic(text):
        return format(text, spec)
    try:
        format("", spec)  # a spec Python refuses for a str: let Python raise on the value
    except ValueError:
        return format(ops.concrete(text, "a format spec Python refuses"), spec)
    return ops.host.text_op("format", [ref_of(ops, text)], [spec], label=f"format {spec!r}")


def join_text(ops: Ops, sep: str, items: Any) -> Any:
    """``sep.join(items)`` of a list or tuple of strings, some symbolic."""
    items = ops.host.current(items)
    if type(items) in (list, tuple) and not any(isinstance(i, Spread) for i in items):
        parts: list[TextPart] = []
        for i, item in enumerate(items):
            item_parts = text_of(ops, ops.host.current(item))
            if item_parts is None:
                break
            parts += ([sep] if i else []) + item_parts
        else:
            return make_text(parts)
    return sep.join(ops.concrete(items, "join over values that are not all strings"))


def _text_list(ops: Ops, items: list[Any]) -> bool:
    spread = [i for i in items if isinstance(i, Spread)]
    if spread:
        return len(items) == 1
    return all(text_of(ops, ops.host.current(i)) is not None for i in items)


def _list_items(ops: Ops, items: list[Any]) -> list[Any]:
    """A list's items as the repr_list op takes them: strings, refs, one Spread."""
    out: list[Any] = []
    for item in map(ops.host.current, items):
        if isinstance(item, str | Spread):
            out.append(item)
        else:
            out.append(ref_of(ops, item))
    return out


# -- operators ----------------------------------------------------------------------------


def binary(ops: Ops, op: type, left: Any, right: Any) -> Any:
    """``left <op> right``."""
    left, right = ops.host.current(left), ops.host.current(right)
    func = BINARY[op]
    if not is_symbolic(left) and not is_symbolic(right):
        return func(left, right)
    if op is ast.Add:
        lparts, rparts = text_of(ops, left), text_of(ops, right)
        if lparts is not None and rparts is not None:
            return make_text(lparts + rparts)
        if _plain_sequences(left, right):
            made = func(left, right)  # list + list: places the items, reads none
            return ops.host.own(made) if type(made) is list else made
    if op is ast.Mult and type(left) is list and type(right) is int and _no_spread(left):
        return func(left, right)
    if op is ast.Mod and type(left) is str:
        from eclectus.adapters.pyeval.formats import percent

        found = percent(ops, left, right)
        if found is not None:
            return found
    return func(*ops.concrete([left, right], f"{op.__name__} of a server value"))


def inplace(ops: Ops, op: type, left: Any, right: Any) -> Any:
    """``left <op>= right``: Python's in-place operator, or :func:`binary` for a string."""
    left, right = ops.host.current(left), ops.host.current(right)
    if not is_symbolic(left) and not is_symbolic(right):
        return INPLACE[op](left, right)
    extends = type(left) is list and type(right) in (list, tuple) and _no_spread(right)
    if op is ast.Add and extends and ops.host.may_hold(left):
        return operator.iadd(left, right)  # extends in place, reading no item
    if op is ast.Add and type(left) is list and is_symbolic(right):
        return operator.iadd(left, ops.concrete(right, "extending a list by a server list"))
    if type(left) in (str, list, tuple) or isinstance(left, Symbolic):
        return binary(ops, op, left, right)
    return INPLACE[op](*ops.concrete([left, right], f"{op.__name__}= of a server value"))


def compare(ops: Ops, op: type, left: Any, right: Any) -> Any:
    """``left <op> right``; identity with None is known for a model's text or message."""
    left, right = ops.host.current(left), ops.host.current(right)
    if not is_symbolic(left) and not is_symbolic(right):
        return COMPARE[op](left, right)
    if op in (ast.In, ast.NotIn) and type(right) is dict and not is_symbolic(left):
        return COMPARE[op](left, right)  # a dict's keys are concrete: its values are not read
    if op in (ast.Is, ast.IsNot) and (left is None or right is None):
        other = right if left is None else left
        if isinstance(other, Ref | SymText | SymMessage | Deferred):
            return op is ast.IsNot  # never None: a str, an AIMessage, an awaitable
    left, right = ops.concrete([left, right], f"a comparison ({op.__name__}) on a server value")
    return COMPARE[op](left, right)


def unary(ops: Ops, op: type, value: Any) -> Any:
    value = ops.host.current(value)
    if op is ast.Not:
        return not truth(ops, value)
    if is_symbolic(value):
        value = ops.concrete(value, f"{op.__name__} of a server value")
    return UNARY[op](value)


def truth(ops: Ops, value: Any) -> bool:
    """``bool(value)``: a list, tuple or dict's is its length's, known; a value's own
    truth (a decision on model output) needs it fetched."""
    value = ops.host.current(value)
    if not is_symbolic(value):
        return bool(value)
    if type(value) in (list, tuple, dict) and _no_spread(value):
        return bool(value)
    return bool(ops.concrete(value, "a decision on a server value (its truth)"))


def attribute(ops: Ops, value: Any, name: str) -> Any:
    """``value.name``: a reply's ``content``, a structured output's field, else Python's."""
    value = ops.host.current(value)
    if not isinstance(value, Symbolic):
        return getattr(value, name)
    if isinstance(value, SymMessage):
        if name == "content":
            return value.ref
        if name == "type":
            return "ai"
    if isinstance(value, SymParsed):
        found = fields.step(value, name, "attr")
        if found is not None:
            return found
    return getattr(ops.concrete(value, f"reading .{name} of a server value"), name)


def subscript(ops: Ops, value: Any, key: Any) -> Any:
    """``value[key]``: a slice of a string, a field of a structured output, a list item
    by a constant or by an integer field the schema bounds; else Python's."""
    value, key = ops.host.current(value), ops.host.current(key)
    if not is_symbolic(value) and not is_symbolic(key):
        return value[key]
    if is_sym_text(ops, value) and type(key) is slice and not is_symbolic(key):
        bounds = [key.start, key.stop, key.step]
        if all(b is None or type(b) is int for b in bounds) and key.step != 0:
            return ops.host.text_op("slice", [ref_of(ops, value)], bounds, label=f"slice {key}")
    if isinstance(value, SymParsed) and isinstance(key, str | int) and type(key) is not bool:
        found = fields.step(value, key, "item")
        if found is not None:
            return found
    if isinstance(value, SymParsed) and isinstance(key, SymParsed):
        known = _known_items(value)  # a list the schema sizes: its items as fields
        found = _index(ops, known, key) if known is not None else None
        if found is not None:
            return found
    if not isinstance(value, Symbolic) and not is_symbolic(key):
        if type(value) in (list, tuple) and not _no_spread(value):
            value = ops.concrete(value, "indexing a fan-out's results")
        return value[key]
    if type(value) in (list, tuple) and isinstance(key, SymParsed) and _no_spread(value):
        found = _index(ops, value, key)
        if found is not None:
            return found
    value, key = ops.concrete([value, key], "indexing with or into a server value")
    return value[key]


def _index(ops: Ops, items: list[Any] | tuple[Any, ...], key: SymParsed) -> Any:
    """``items[key]`` on the server when the schema bounds the integer ``key`` within the
    list and every item is a string; None otherwise."""
    bounds = fields.int_bounds(key)
    if bounds is None or not -len(items) <= bounds[0] <= bounds[1] < len(items):
        return None
    parts = [text_of(ops, ops.host.current(item)) for item in items]
    if any(p is None for p in parts):
        return None
    inputs = [ops.host.as_ref(key), *(make_item(ops, p) for p in parts if p is not None)]
    return ops.host.text_op("index", inputs, label=f"index into {len(items)} item(s)")


def _known_items(value: SymParsed) -> list[SymParsed] | None:
    """The items of a structured list, each a field, when the schema guarantees them."""
    shape = fields.shape(value)
    if shape is None or shape.kind != "list" or not shape.min_items:
        return None
    items = [fields.step(value, i, "item") for i in range(shape.min_items)]
    if shape.max_items != shape.min_items or any(i is None for i in items):
        return None
    return items  # type: ignore[return-value]


def make_item(ops: Ops, parts: list[TextPart]) -> Ref | str:
    text = make_text(parts)
    return text if isinstance(text, str | Ref) else ops.host.as_ref(text)


def _plain_sequences(left: Any, right: Any) -> bool:
    return type(left) is type(right) and type(left) in (list, tuple)


def _no_spread(value: Any) -> bool:
    """No item stands for a fan-out's results (whose number is not known yet)."""
    items = value.values() if isinstance(value, dict) else value
    return not any(isinstance(i, Spread) for i in items)
