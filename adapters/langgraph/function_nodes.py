"""Python function nodes, routers and ``Send`` fan-outs, evaluated (adapters/pyeval).

LangGraph wraps every function of a graph (a node, a conditional edge's router, a fan-out
returning ``Send``\\s) in a ``RunnableCallable``. This registers its lowering: the function
is evaluated over the symbolic state, so its model calls join the run's graph, its Python
on model output becomes server ops where the table has them and graph breaks (one fetch
each) where it does not. A function the evaluator cannot run (a ``try``, a ``with``, a
class body...), one that takes LangGraph's runtime, store or writer, and every function in
a speculative lowering (a server switch's branch, a server map's worker, which may be
taken back and must not have run) lower as NotLowerable: the chain compiler then runs them
as before, a client cut over the resolved state, exact.
"""

from __future__ import annotations

from inspect import iscoroutinefunction
from types import FunctionType
from typing import Any

from langchain_core.runnables import Runnable
from langgraph._internal._runnable import RunnableCallable

from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import lower, register
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.pyeval import NotEvaluable, evaluate
from eclectus.adapters.pyeval.entry import evaluable


def function_of(node: RunnableCallable, mode: str) -> Any:
    """The function LangGraph calls for ``node`` in a run of ``mode``, or None (pure): an
    ``async def`` in an async run (LangGraph's own async wrapper of a sync function, a
    ``partial``, stands for the sync one), else the sync function."""
    if mode == "async" and isinstance(node.afunc, FunctionType) and iscoroutinefunction(node.afunc):
        return node.afunc
    return node.func


def why_not(node: RunnableCallable, mode: str = "sync") -> str | None:
    """Why the evaluator leaves ``node`` to Python, or None when it evaluates it (pure)."""
    if set(node.func_accepts) - {"config"}:
        return f"it takes LangGraph's {sorted(set(node.func_accepts) - {'config'})}"
    if node.explode_args:
        return "its arguments are exploded"
    fn = function_of(node, mode)
    if fn is None:
        return "no synchronous function"
    try:
        evaluable(fn)
    except NotEvaluable as exc:
        return exc.reason
    return None


def speculative(ctx: Lowering) -> bool:
    """A lowering that may be taken back: a switch's branch, a map's worker (pure)."""
    from eclectus.adapters.langgraph.fanout import _Capture
    from eclectus.adapters.langgraph.routing import ForkLowering

    return isinstance(ctx, ForkLowering | _Capture)


@register(RunnableCallable)
async def lower_function(node: RunnableCallable, value: Any, ctx: Lowering) -> Any:
    """The node's function evaluated on ``value`` (its symbolic state or ``Send`` arg)."""
    if speculative(ctx):
        raise NotLowerable("a Python function in a lowering that may be taken back")
    reason = why_not(node, ctx.mode)
    if reason is not None:
        raise NotLowerable(f"the function runs as Python ({reason})")
    kwargs = dict(node.kwargs)
    if "config" in node.func_accepts:
        kwargs["config"] = ctx.config
    try:
        # the state dict is made for this node: it may hold what the function stores in it
        fn = function_of(node, ctx.mode)
        output = await evaluate(fn, [value], kwargs, ctx, owned=(value,))
    except NotEvaluable as exc:  # before anything ran (the arguments did not bind)
        raise NotLowerable(exc.reason) from exc
    if node.recurse and isinstance(output, Runnable):
        return await lower(output, value, ctx)  # LangGraph runs a returned runnable
    return output
