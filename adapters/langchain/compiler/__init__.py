"""The chain compiler: LangChain runnables lowered onto an Eclectus graph.

Importing this package registers the lowerings (structure.py, leaves.py, packaging.py,
parsers.py) in
registry.py.
"""

from eclectus.adapters.langchain.compiler import (  # noqa: F401 (registers)
    leaves,
    packaging,
    parsers,
    structure,
)
from eclectus.adapters.langchain.compiler.compile import compile, find_model
from eclectus.adapters.langchain.compiler.runnable import CompiledRunnable

__all__ = ["CompiledRunnable", "compile", "find_model"]
