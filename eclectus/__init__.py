"""Eclectus: serve multi-call LLM applications as graphs of Semantic Variables.

Subpackages: ``adapters`` (SDK, LangChain, LlamaIndex), ``server`` (WebSocket server, graph,
scheduler, built-in engine), ``kernels`` (attention), ``recipes``, ``evals``.
"""

__version__ = "0.1.0"
