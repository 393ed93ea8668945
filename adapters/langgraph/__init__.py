"""LangGraph on Eclectus: a whole StateGraph as one server graph (docs/langgraph.md).

``compile(app)`` wraps a compiled StateGraph; LCEL nodes over ChatEclectus become calls of
one submitted graph, Python nodes and routers are client cuts (a :class:`SendEach` fan-out
over a constrained JSON list is a server-side map), and anything the compiler
cannot reproduce exactly runs eagerly on LangGraph with an :class:`EagerFallbackWarning`.
"""

from eclectus.adapters.langgraph.compiled import CompiledGraph, EagerFallbackWarning, compile
from eclectus.adapters.langgraph.fanout import SendEach

__all__ = ["CompiledGraph", "EagerFallbackWarning", "SendEach", "compile"]
