"""``compile(chain)``: wrap a LangChain runnable so it runs as one graph on Eclectus."""

from __future__ import annotations

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
    runnable: Runnable | dict[str, Any], *, model: Any | None = None, app: str | None = None
) -> CompiledRunnable:
    """A runnable with the same invoke/ainvoke/batch/abatch/stream/astream behaviour whose
    runs submit the whole graph in one frame. ``model``: the Eclectus model whose server
    runs the graph (default: the first one in the chain). ``app``: the session's
    application tag (default: the model's ``app``, else the chain's name). Raises
    ValueError when the chain holds no Eclectus model."""
    chain = coerce_to_runnable(runnable)
    model = model or find_model(chain)
    if model is None:
        raise ValueError("compile() needs a ChatEclectus or EclectusLLM in the chain (or model=)")
    return CompiledRunnable(chain, model, app)
