"""Lowering of packaging lambdas: ``lambda s: [s]``, ``lambda m: {"messages": [m]}``.

A LangGraph node must return a state update, so LCEL nodes end in a small lambda that only
packs the chain's output into lists and dicts, or picks a constant key. Such a function can
run on symbolic values with an exact result: :func:`is_packaging` admits a plain function of
one argument whose bytecode only loads locals and constants, builds lists, tuples and dicts,
subscripts, and returns: no globals, closures, attributes, calls, comparisons or branches,
so it cannot look at a value it does not have, nor do anything else. Any other function, or
one that raises, is a client cut as before.
"""

from __future__ import annotations

import dis
import inspect
import types
from typing import Any

from langchain_core.runnables import RunnableLambda

from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import register
from eclectus.adapters.langchain.errors import NotLowerable

_PACKING_OPS = frozenset(
    {
        "RESUME", "NOP", "CACHE", "COPY", "SWAP", "POP_TOP",
        "LOAD_FAST", "LOAD_FAST_BORROW", "LOAD_FAST_LOAD_FAST", "LOAD_FAST_CHECK",
        "LOAD_CONST", "LOAD_SMALL_INT", "STORE_FAST",
        "BUILD_LIST", "BUILD_TUPLE", "BUILD_MAP", "BUILD_CONST_KEY_MAP",
        "BINARY_SUBSCR", "RETURN_VALUE", "RETURN_CONST",
    }
)  # fmt: skip
_VARIADIC = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def is_packaging(func: Any) -> bool:
    """Whether ``func`` only packs or picks its one argument (pure; see the module)."""
    if not isinstance(func, types.FunctionType) or func.__closure__:
        return False
    code = func.__code__
    if code.co_argcount != 1 or code.co_kwonlyargcount or code.co_flags & _VARIADIC:
        return False
    if any(isinstance(const, types.CodeType) for const in code.co_consts):
        return False
    return all(op.opname in _PACKING_OPS for op in dis.get_instructions(code))


@register(RunnableLambda, when=lambda fn: is_packaging(getattr(fn, "func", None)))
async def lower_lambda(fn: RunnableLambda, value: Any, ctx: Lowering) -> Any:
    func = fn.func
    try:
        output = func(value)  # type: ignore[misc]
    except Exception as exc:  # the cut runs it on concrete values and raises as eager does
        raise NotLowerable(f"the function raised {type(exc).__name__} on symbolic input") from exc
    ctx.trace.node(f"packaging lambda {fn.get_name()}")
    return output
