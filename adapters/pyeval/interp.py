"""The evaluator: one call of one function, its statements run over concrete and symbolic
values (statements.py, expressions.py), its helpers evaluated the same way.

:class:`Evaluator` joins the two halves with what they share: the frame (frame.py), the
host (host.py), where the evaluation stands (for graph breaks), and the calls of the
app's own functions, evaluated down to ``MAX_DEPTH`` nested calls.
"""

from __future__ import annotations

import ast
import inspect
import types
from typing import Any

from eclectus.adapters.pyeval.expressions import Expressions
from eclectus.adapters.pyeval.frame import Frame
from eclectus.adapters.pyeval.host import MAX_DEPTH, Host
from eclectus.adapters.pyeval.source import Source, function_source
from eclectus.adapters.pyeval.statements import RETURN
from eclectus.adapters.pyeval.values import Deferred, is_symbolic


class Evaluator(Expressions):
    """Runs one call of one function (see the module). Mutates its frame and, through
    the host, the run's graph."""

    def __init__(self, fn: types.FunctionType, source: Source, host: Host) -> None:
        self.fn = fn
        self.source = source
        self.host = host
        self.frame = Frame(fn, source)
        self.line = getattr(source.node, "lineno", 0)
        self.returned: Any = None

    def run(self, arguments: dict[str, Any]) -> Any:
        """The call's result for ``arguments`` (parameter name -> value, bound as Python
        binds them)."""
        for name, value in arguments.items():
            self.frame.store(name, value)
        self.host.ctx.trace.python(f"{self.fn.__qualname__}: evaluated (Python, partially)")
        if self.block(self.source.body) is RETURN:
            return self.returned
        return None

    def where(self) -> str:
        return f"{self.fn.__qualname__} line {self.line}"

    def concrete(self, value: Any, reason: str) -> Any:
        """``value`` fetched where the evaluation stands (a graph break if it must)."""
        return self.host.concrete(value, self.where(), reason)

    def evaluate_helper(
        self, fn: types.FunctionType, bound: list[Any], args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        """A call of the app's own function ``fn`` (``bound``: a method's ``self``):
        evaluated the same way (an ``async def`` gives a Deferred), or run as Python when
        it cannot be (its arguments fetched first)."""
        source = function_source(fn)
        if isinstance(source, Source) and not source.reasons and self.host.depth < MAX_DEPTH:
            arguments = bind_arguments(fn, [*bound, *args], kwargs)
            if arguments is not None:
                if not source.is_async:
                    return self._nested(fn, source, arguments)

                def real() -> Any:  # the app's own coroutine, for code that is not ours
                    why = f"{fn.__qualname__} awaited as Python"
                    return fn(*bound, *self.concrete(args, why), **self.concrete(kwargs, why))

                return Deferred(lambda: self._nested(fn, source, arguments), real)
        why = source if isinstance(source, str) else "; ".join(source.reasons) or "too deep"
        if is_symbolic(args) or is_symbolic(kwargs):
            self.host.ctx.trace.python(f"{fn.__qualname__}: runs as Python ({why})")
        args = self.concrete(args, f"{fn.__qualname__} runs as Python ({why})")
        kwargs = self.concrete(kwargs, f"{fn.__qualname__} runs as Python ({why})")
        return fn(*bound, *args, **kwargs)

    def _nested(self, fn: types.FunctionType, source: Source, bound: dict[str, Any]) -> Any:
        self.host.depth += 1
        try:
            return Evaluator(fn, source, self.host).run(bound)
        finally:
            self.host.depth -= 1

    def _scope(self, generators: list[ast.comprehension]) -> Evaluator:
        """An evaluator for a comprehension's own scope: its targets are its own
        variables, everything else the function's (Python 3's comprehension scope)."""
        child = Evaluator.__new__(Evaluator)
        child.fn, child.source, child.host = self.fn, self.source, self.host
        child.line, child.returned = self.line, None
        child.frame = self.frame.child(
            {n.id for g in generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        )
        return child


def bind_arguments(fn: types.FunctionType, args: list[Any], kwargs: dict[str, Any]) -> dict | None:
    """Parameter name -> value as Python binds them; None when they do not bind (the call
    then runs as Python, raising Python's own TypeError)."""
    try:
        bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)
