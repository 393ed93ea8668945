"""The Python evaluator: app code run with model outputs symbolic (docs/langchain.md,
"Plain Python functions"; docs/langgraph.md, "Function nodes").

Concrete values stay concrete and evaluate exactly as Python does; a model call's output
is a server variable; operations on it from a closed table become server ops; anything
else that touches it fetches it first (a graph break); a function whose code the
evaluator does not implement runs as Python whole, decided before any of it runs.
"""

from eclectus.adapters.pyeval.entry import (
    CompiledFunction,
    NotEvaluable,
    compile_function,
    evaluate,
)

__all__ = ["CompiledFunction", "NotEvaluable", "compile_function", "evaluate"]
