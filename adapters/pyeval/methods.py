"""Method calls on symbolic values: ``reply.strip()``, ``text.replace("a", "b")``.

A model's text is a ``str``; its ``strip`` / ``lstrip`` / ``rstrip`` / ``lower`` /
``upper`` / ``replace`` with constant arguments are server text ops, exactly Python's. Any
other method of a symbolic value (``split``, ``startswith``, a message's or a parsed
model's methods) is Python's, on the value fetched first. As Python does, the method is
looked up before the arguments are evaluated: a name ``str`` lacks raises AttributeError
with no argument evaluated.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from eclectus.adapters.pyeval import calls
from eclectus.adapters.pyeval.operators import is_sym_text, ref_of
from eclectus.adapters.pyeval.values import is_symbolic

if TYPE_CHECKING:
    from eclectus.adapters.pyeval.interp import Evaluator

_STRIPS = frozenset({"strip", "lstrip", "rstrip"})


def symbolic_method(ev: Evaluator, owner: Any, name: str, node: ast.Call) -> Any:
    """``owner.name(...)`` for a symbolic ``owner``, the call's arguments from ``node``."""
    owner = ev.host.current(owner)
    if not is_sym_text(ev, owner) or not hasattr(str, name):
        concrete = ev.concrete(owner, f"calling .{name}() of a server value")
        func = getattr(concrete, name)
        args, kwargs = ev.arguments(node)
        return calls.call(ev, func, args, kwargs)
    args, kwargs = ev.arguments(node)
    args = [ev.host.current(a) for a in args]
    lowered = _text_method(ev, owner, name, args, kwargs)
    if lowered is not None:
        return lowered
    concrete = ev.concrete(owner, f"str.{name} of a server value")
    return calls.call(ev, getattr(concrete, name), args, kwargs)


def _text_method(ev: Evaluator, owner: Any, name: str, args: list[Any], kwargs: dict) -> Any:
    """The server op for a string method with constant arguments, or None."""
    if kwargs or is_symbolic(args):
        return None
    if name in _STRIPS and len(args) <= 1 and all(a is None or type(a) is str for a in args):
        return ev.host.text_op(name, [ref_of(ev, owner)], args, label=f"{name}{tuple(args)}")
    if name in ("lower", "upper") and not args:
        return ev.host.text_op(name, [ref_of(ev, owner)], label=name)
    texts = len(args) in (2, 3) and all(type(a) is str for a in args[:2])
    if name == "replace" and texts and (len(args) == 2 or type(args[2]) is int):
        label = f"replace{tuple(args)}"
        return ev.host.text_op("replace", [ref_of(ev, owner)], args, label=label)
    if name == "__str__" and not args:
        return owner
    return None
