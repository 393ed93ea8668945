"""The built-in engine: paged KV, prefix sharing, continuous batching, sampling.

``from eclectus.server.engine import LLM, SamplingParams`` for offline use; ``AsyncEngine`` and
``ProcessEngine`` are the server's built-in backends. The torch-heavy names load lazily: the
server's ``Backend`` contract and the remote pool import only ``request.py`` (the engine's
request types), and Python runs this file first, so it must import nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig

if TYPE_CHECKING:
    from eclectus.server.engine.async_engine import AsyncEngine
    from eclectus.server.engine.llm import LLM, RequestOutput
    from eclectus.server.engine.llm_engine import LLMEngine
    from eclectus.server.engine.process_engine import ProcessEngine

_LAZY = {
    "LLM": "eclectus.server.engine.llm",
    "RequestOutput": "eclectus.server.engine.llm",
    "LLMEngine": "eclectus.server.engine.llm_engine",
    "AsyncEngine": "eclectus.server.engine.async_engine",
    "ProcessEngine": "eclectus.server.engine.process_engine",
}

__all__ = [
    "LLM",
    "AsyncEngine",
    "EngineConfig",
    "LLMEngine",
    "ProcessEngine",
    "RequestOutput",
    "SamplingParams",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
