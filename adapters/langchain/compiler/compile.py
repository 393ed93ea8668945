"""``compile(chain)``: wrap a LangChain runnable so it runs as one graph on Eclectus."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from langchain_core.runnables import Runnable
from langchain_core.runnables.base import coerce_to_runnable

from eclectus.adapters.langchain.compiler.leaves import MODEL_TYPES
from eclectus.adapters.langchain.compiler.plan import children
from eclectus.adapters.langchain.compiler.runnable import CompiledRunnable


def find_model(runnable: Any) -> Any | None:
    """The first Eclectus model in the chain, depth first (pure)."""
    if isinstance(runnable, MODEL_TYPES):
        return runnable
    for _, child in children(runnable):
        found = find_model(child)
        if found is not None:
            return found
    return None


def compile(
    runnable: Runnable | dict[str, Any] | Callable[..., Any],
    *,
    model: Any | None = None,
    app: str | None = None,
) -> Any:
    """A runnable with the same invoke/ainvoke/batch/abatch/stream/astream behaviour whose
    runs submit the whole graph in one frame. ``model``: the Eclectus model whose server
    runs the graph (default: the first one in the chain). ``app``: the session's
    application tag (default: the model's ``app``, else the chain's name). Raises
    ValueError when the chain holds no Eclectus model.

    A plain function (``def`` or ``async def``, not a Runnable) compiles too: the result is
    a callable with its signature and results whose calls evaluate it, its model calls on
    the server (adapters/pyeval; docs/langchain.md, "Plain Python functions")."""
    if isinstance(runnable, types.FunctionType | types.MethodType):
        from eclectus.adapters.pyeval import compile_function

        return compile_function(runnable, model, app)
    chain = coerce_to_runnable(runnable)
    model = model or find_model(chain)
    if model is None:
        raise ValueError("compile() needs a ChatEclectus or EclectusLLM in the chain (or model=)")
    return CompiledRunnable(chain, model, app)
