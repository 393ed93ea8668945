"""What the LangGraph recipes share: compiling their app for the target, and counting the
client frames a compiled run sent (the round trips it cost)."""

from __future__ import annotations

from typing import Any

from eclectus.recipes.target import ModelFactory


def prepare_graph(models: ModelFactory, app: Any, name: str) -> Any:
    """``app`` (a compiled StateGraph) as the recipe runs it: wrapped by the LangGraph
    compiler in Eclectus mode (unless compiling is off), unchanged otherwise (pure)."""
    if models.backend != "eclectus" or not models.target.use_compile:
        return app
    from eclectus.adapters.langgraph import compile as compile_graph

    return compile_graph(app, app_name=name)


def frame_details(runner: Any, num_calls: int) -> dict[str, Any]:
    """Round trips of the run: a compiled graph's client frames, else one per model call
    (each one a request and its answer) (pure)."""
    frames = getattr(runner, "last_frames", None)
    if frames is not None:
        return {"client frames": frames}
    return {"client round trips": num_calls}
