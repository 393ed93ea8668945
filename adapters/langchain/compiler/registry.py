"""The lowering registry: runnable type -> async function lowering it onto the server.

``lower(runnable, value, ctx)`` looks the runnable's exact type up (a subclass may change
behaviour, so it is not assumed to lower like its base; a pydantic generic parametrization
such as ``RunnableParallel[dict[str, Any]]`` is not a subclass in that sense and looks up
as its origin); a lowering that meets something it
cannot do exactly raises NotLowerable *before* declaring anything, and the runnable then runs
on the client as a cut. An unregistered type is always a cut. Lowerings of composite
runnables only recurse; cuts therefore happen at the innermost runnable that needs one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.runnables import Runnable

from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.errors import NotLowerable

LowerFn = Callable[[Any, Any, Lowering], Awaitable[Any]]
_REGISTRY: dict[type, LowerFn] = {}
# Model classes lower by isinstance: a subclass of ChatEclectus is still our model.
_BY_INSTANCE: list[tuple[type, LowerFn]] = []
# Types that lower only when a static test of the instance passes (else: always a cut).
_WHEN: dict[type, Callable[[Any], bool]] = {}


def register(
    *types: type, subclasses: bool = False, when: Callable[[Any], bool] | None = None
) -> Callable[[LowerFn], LowerFn]:
    """Decorator: ``fn`` lowers runnables of exactly ``types`` (or any subclass when
    ``subclasses``), those for which ``when`` holds if given. Mutates the registry at
    import time."""

    def decorate(fn: LowerFn) -> LowerFn:
        for cls in types:
            if when is not None:
                _WHEN[cls] = when
            if subclasses:
                _BY_INSTANCE.append((cls, fn))
            else:
                _REGISTRY[cls] = fn
        return fn

    return decorate


def unparametrized(cls: type) -> type:
    """``cls`` with pydantic generic parametrization stripped: LangChain builds some
    runnables as ``RunnableParallel[dict[str, Any]]`` (``.assign``'s mapper), a distinct
    class object that behaves exactly like ``RunnableParallel``. A real subclass is kept
    (its origin is None). Pure."""
    while True:
        metadata = getattr(cls, "__pydantic_generic_metadata__", None)
        origin = metadata.get("origin") if isinstance(metadata, dict) else None
        if not isinstance(origin, type) or origin is cls:
            return cls
        cls = origin


def lowering_for(runnable: Any) -> LowerFn | None:
    """The registered lowering for ``runnable``, or None (pure)."""
    cls = unparametrized(type(runnable))
    fn = _REGISTRY.get(cls)
    if fn is not None:
        when = _WHEN.get(cls)
        return fn if when is None or when(runnable) else None
    for cls, candidate in _BY_INSTANCE:
        if isinstance(runnable, cls):
            return candidate
    return None


async def lower(runnable: Runnable, value: Any, ctx: Lowering) -> Any:
    """The symbolic output of ``runnable`` on symbolic input ``value`` (declares server
    work on ``ctx``; runs a cut on the client where needed)."""
    fn = lowering_for(runnable)
    if fn is None:
        return await ctx.cut(runnable, value, f"{type(runnable).__name__} is not compilable")
    try:
        return await fn(runnable, value, ctx)
    except NotLowerable as exc:
        return await ctx.cut(runnable, value, exc.reason)
