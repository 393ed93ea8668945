"""Entry points: one function evaluated in a run, and ``compile(fn)`` for a whole app
function.

:func:`evaluate` runs a function of the app (a LangGraph node, router or fan-out, or the
function :func:`compile_function` wraps) on a worker thread over its arguments, concrete
or symbolic, and returns its result with the evaluator's own values said in the chain
compiler's terms (:func:`export`). A function the pre-pass refuses raises
:class:`NotEvaluable` before any of it runs; the caller then runs it as Python.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from langgraph.types import Command, Send

from eclectus.adapters.calls import Caller
from eclectus.adapters.client.meter import counting
from eclectus.adapters.connection import connection_for, ws_url
from eclectus.adapters.langchain.compiler.callbacks import fire as fire_callbacks
from eclectus.adapters.langchain.compiler.callbacks import pending_vars
from eclectus.adapters.langchain.compiler.context import Lowering, cut_gate
from eclectus.adapters.langchain.compiler.graph import GraphTrace
from eclectus.adapters.langchain.compiler.runnable import run_blocking
from eclectus.adapters.langchain.compiler.symbols import SymParsed
from eclectus.adapters.pyeval.host import Host
from eclectus.adapters.pyeval.interp import Evaluator, bind_arguments
from eclectus.adapters.pyeval.source import Source, function_source
from eclectus.adapters.pyeval.values import Deferred, SymText

# Evaluations block on the run's loop (lowering, fetching), never on each other: a pool of
# its own, so they never starve the default executor the run's cuts run on.
_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="eclectus-pyeval")


class NotEvaluable(Exception):
    """The function runs as Python: the evaluator cannot run it (decided before any of it
    ran); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def evaluable(fn: Any) -> types.FunctionType:
    """The plain function to evaluate, or NotEvaluable with the reason (pure)."""
    if not isinstance(fn, types.FunctionType):
        raise NotEvaluable(f"{type(fn).__name__} is not a plain Python function")
    source = function_source(fn)
    if isinstance(source, str):
        raise NotEvaluable(source)
    if source.reasons:
        raise NotEvaluable("; ".join(source.reasons))
    return fn


async def evaluate(
    fn: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    ctx: Lowering,
    *,
    final: bool = False,
    owned: tuple[Any, ...] = (),
) -> Any:
    """``fn(*args, **kwargs)`` evaluated on ``ctx`` (called on the run's loop). With
    ``final``, the result is fetched concrete, with the values callbacks need, in one
    frame; else it is returned symbolic (exported). ``owned``: containers made for this
    call that may hold symbolic values (a node's state dict). NotEvaluable before anything
    ran."""
    function = evaluable(fn)
    source = function_source(function)
    assert isinstance(source, Source)
    arguments = bind_arguments(function, args, kwargs)
    if arguments is None:
        raise NotEvaluable("the arguments do not bind (Python raises its own TypeError)")
    loop = asyncio.get_running_loop()
    host = Host(ctx, loop)
    for container in owned:
        if type(container) in (list, dict):
            host.own(container)
    context = contextvars.copy_context()  # the run's meter and LangChain config go along

    def work() -> Any:
        result = Evaluator(function, source, host).run(arguments)
        if final:
            extra = pending_vars(ctx.calls, ctx.config)
            return host.concrete(result, "", "", extra=extra)
        return export(host, result)

    return await loop.run_in_executor(_POOL, context.run, work)


def export(host: Host, value: Any) -> Any:
    """``value`` for the chain compiler and the LangGraph executor: a symbolic string as
    a server variable, a string field as its field op, an awaitable concrete (mutates
    nothing the app holds but builds new containers)."""
    value = host.current(value)
    if isinstance(value, SymText) or (isinstance(value, SymParsed) and _is_text(value)):
        return host.as_ref(value)
    if isinstance(value, Deferred):
        return host.concrete(value, "the function's result", "an awaitable in the result")
    if type(value) is dict:
        return {k: export(host, v) for k, v in value.items()}
    if type(value) is list:
        return [export(host, v) for v in value]
    if type(value) is tuple:
        return tuple(export(host, v) for v in value)
    if isinstance(value, Send):
        return Send(value.node, export(host, value.arg))
    if isinstance(value, Command):
        return replace(value, update=export(host, value.update))
    return value


def _is_text(value: SymParsed) -> bool:
    from eclectus.adapters.pyeval import fields

    return fields.leaf(value) == "str"


class CompiledFunction:
    """A plain app function compiled: same signature and results; each call evaluates it
    over its arguments into one server graph. ``last_graph``: the last call's trace;
    ``last_frames``: every frame it caused (breaks and eager calls included)."""

    def __init__(
        self, fn: types.FunctionType | types.MethodType, model: Any, app: str | None
    ) -> None:
        functools.update_wrapper(self, fn)
        self.bound: list[Any] = [fn.__self__] if isinstance(fn, types.MethodType) else []
        fn = fn.__func__ if isinstance(fn, types.MethodType) else fn
        self.fn: types.FunctionType = fn
        self.model = model
        self.app = app or model.app_name or fn.__name__
        self.last_graph: GraphTrace | None = None
        self.last_frames = 0
        source = function_source(fn)
        self.reasons = [source] if isinstance(source, str) else list(source.reasons)

    def explain(self) -> str:
        """Whether the function is evaluated (or runs as Python, and why), then the graph
        the last call built: calls, ops, cuts, and every break with its line and reason."""
        if self.reasons:
            head = f"{self.fn.__qualname__}: runs as Python (" + "; ".join(self.reasons) + ")"
        else:
            head = f"{self.fn.__qualname__}: evaluated (model calls on the server)"
        built = self.last_graph.render() if self.last_graph else "graph: not run yet"
        return f"{head}\nlast run: {self.last_frames} client frame(s)\n{built}"

    def __repr__(self) -> str:
        return f"CompiledFunction({self.fn.__qualname__})"

    async def _run(self, args: tuple, kwargs: dict, mode: Literal["sync", "async"]) -> Any:
        config = ensure_config()
        ctx = self._context(mode, config)
        with counting() as meter:
            try:
                try:
                    arguments = [*self.bound, *args]
                    return await evaluate(self.fn, arguments, kwargs, ctx, final=True)
                except NotEvaluable as exc:
                    ctx.trace.python(f"{self.fn.__qualname__}: runs as Python ({exc.reason})")
                    if mode == "async":
                        return await self.fn(*self.bound, *args, **kwargs)
                    return await asyncio.to_thread(self.fn, *self.bound, *args, **kwargs)
            finally:
                await fire_callbacks(ctx.calls, ctx.config, mode, ctx.fetch)
                self.last_graph, self.last_frames = ctx.trace, meter.num_frames

    def _context(self, mode: Literal["sync", "async"], config: RunnableConfig) -> Lowering:
        model = self.model
        connection = connection_for(model.eclectus_url, model.token, self.app)
        session = Caller(connection, model.call_options()).session
        server = (ws_url(model.eclectus_url), model.token)
        return Lowering(
            session,
            server,
            mode,
            config,
            GraphTrace(),
            model.request_timeout,
            model.call_options(),
            cut_gate(config),
        )


class _SyncFunction(CompiledFunction):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run_blocking(self._run(args, kwargs, "sync"))


class _AsyncFunction(CompiledFunction):
    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await self._run(args, kwargs, "async")


def compile_function(
    fn: types.FunctionType | types.MethodType, model: Any | None = None, app: str | None = None
) -> CompiledFunction:
    """``fn`` compiled (see :class:`CompiledFunction`); ``model``: the Eclectus model whose
    server runs the graph (default: the first one ``fn`` or its helpers refer to).
    ValueError when there is none."""
    from eclectus.adapters.pyeval.discover import model_in_function

    model = model or model_in_function(fn)
    if model is None:
        raise ValueError(
            "compile() needs a ChatEclectus or EclectusLLM the function uses (or model=)"
        )
    if not isinstance(fn, types.FunctionType | types.MethodType):
        raise TypeError(f"compile() takes a Runnable or a plain function, not {fn!r}")
    cls = _AsyncFunction if inspect.iscoroutinefunction(fn) else _SyncFunction
    return cls(fn, model, app)
