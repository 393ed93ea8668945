"""What the LangGraph recipes share: compiling their app for the target, counting the
client frames a compiled run sent (the round trips it cost), and the JSON Schema of a list
their planners write (the fan-out a compiled run maps on the server)."""

from __future__ import annotations

from typing import Any

from eclectus.recipes.target import ModelFactory


def prepare_graph(models: ModelFactory, app: Any, name: str) -> Any:
    """``app`` (a compiled StateGraph) as the recipe runs it: wrapped by the LangGraph
    compiler in Eclectus mode (unless compiling is off), unchanged otherwise (pure)."""
    if models.backend != "eclectus" or not models.target.use_compile:
        return app
    from eclectus.adapters.langgraph import compile as compile_graph

    return compile_graph(app, app_name=models.app or name)


def frame_details(runner: Any, num_calls: int) -> dict[str, Any]:
    """Round trips of the run: a compiled graph's client frames, else one per model call
    (each one a request and its answer) (pure)."""
    frames = getattr(runner, "last_frames", None)
    if frames is not None:
        return {"client frames": frames}
    return {"client round trips": num_calls}


def list_schema(title: str, key: str, count: int, item: dict[str, Any]) -> dict[str, Any]:
    """A JSON object whose one key, ``key``, holds exactly ``count`` values of ``item``'s
    schema: the fan-out's width is known before the reply (pure)."""
    array = {"type": "array", "items": item, "minItems": count, "maxItems": count}
    return {"title": title, "type": "object", "properties": {key: array}, "required": [key]}
