"""What of a compiled LangGraph app the graph compiler runs, and what it leaves to LangGraph.

:func:`unsupported` lists the reasons a whole app (or one run's config or stream modes)
must run eagerly; :func:`node_kind` says where each node runs: an LCEL runnable lowers onto
the server, a Python function is a client cut.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import Runnable
from langgraph._internal._runnable import RunnableCallable
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.channels.ephemeral_value import EphemeralValue
from langgraph.channels.last_value import LastValue

# stream modes the compiled run reproduces (from its per-step record); others run eagerly
STREAM_MODES = ("values", "updates")
_CHANNELS = (LastValue, BinaryOperatorAggregate, EphemeralValue)


def unsupported(app: Any) -> list[str]:
    """Why ``app`` (a CompiledStateGraph) cannot be compiled; [] when it can (pure)."""
    builder = getattr(app, "builder", None)
    if builder is None or not hasattr(builder, "channels"):
        return [f"{type(app).__name__} is not a compiled StateGraph"]
    reasons = []
    if app.checkpointer not in (None, False):
        reasons.append("a checkpointer (threads, time travel) is LangGraph's")
    if app.interrupt_before_nodes or app.interrupt_after_nodes:
        reasons.append("interrupt_before/after pauses are LangGraph's")
    if builder.waiting_edges:
        reasons.append("edges that wait for several nodes (add_edge([a, b], c))")
    if builder.managed:
        reasons.append("managed values")
    for name, channel in builder.channels.items():
        if not isinstance(channel, _CHANNELS):
            reasons.append(f"state key {name!r} uses a {type(channel).__name__} channel")
    for name, spec in builder.nodes.items():
        if spec.retry_policy or spec.cache_policy or spec.defer or spec.is_error_handler:
            reasons.append(f"node {name!r} has a retry, cache, defer or error policy")
        if getattr(spec, "error_handler_node", None) or getattr(spec, "timeout", None):
            reasons.append(f"node {name!r} has an error handler or timeout")
        # a node taking ``runtime`` (ToolNode) gets the run's default one (compiled runs
        # have no context: a run passing ``context=`` is eager); not with a store
        plain = {"config"} if app.store is not None else {"config", "runtime"}
        injected = set(getattr(spec.runnable, "func_accepts", {})) - plain
        if injected:
            reasons.append(f"node {name!r} takes LangGraph's {sorted(injected)} (runtime)")
    return reasons


def run_unsupported(config: dict[str, Any], stream_modes: list[str]) -> list[str]:
    """Why one run must be eager: an interrupt in its config, or a stream mode (pure)."""
    reasons = [f"stream_mode {m!r}" for m in stream_modes if m not in STREAM_MODES]
    if config.get("interrupt_before") or config.get("interrupt_after"):
        reasons.append("interrupts in the run's config")
    if config.get("configurable", {}).get("checkpoint_id"):
        reasons.append("a checkpoint to resume from")
    return reasons


def is_python_node(runnable: Runnable) -> bool:
    """A node that is a plain Python function (LangGraph wraps those) (pure)."""
    return isinstance(runnable, RunnableCallable)


def node_kind(runnable: Runnable) -> str:
    """One line: where a node runs and why (pure)."""
    if is_python_node(runnable):
        from eclectus.adapters.langgraph.function_nodes import why_not

        reason = why_not(runnable)  # type: ignore[arg-type]
        if reason is None:
            return (
                "server (a Python function, evaluated: its model calls and the Python on "
                "their outputs the server can do join the graph; see the run's breaks)"
            )
        return f"client cut (a Python function that runs as Python: {reason})"
    return f"server ({runnable.get_name()} lowers onto the graph; see the LCEL plan)"


def edge_kind(branch: Any) -> str:
    """One line: where a conditional edge runs and why (pure)."""
    from eclectus.adapters.langgraph.fanout import SendEach

    fan = getattr(branch.path, "func", None)
    if isinstance(fan, SendEach):
        return (
            f"server map when {fan.over!r} is a constrained JSON list (SendEach), else a client cut"
        )
    from eclectus.adapters.langgraph.function_nodes import why_not

    reason = why_not(branch.path) if isinstance(branch.path, RunnableCallable) else "not a function"
    if reason is not None:
        return (
            f"client cut (the router runs as Python: {reason}), or a server switch when it "
            "routes on a constrained choice (see the last run)"
        )
    return (
        "evaluated (the router runs over the symbolic state; a decision on model output is "
        "a break, one frame; Send fan-outs ship in the next frame), or a server switch when "
        "it routes on a constrained choice (see the last run)"
    )
