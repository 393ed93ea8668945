"""``compile(app)``: a LangGraph app whose runs submit its graph to Eclectus in few frames.

The compiled graph has the app's ``invoke``/``ainvoke``/``batch``/``abatch``/``stream``/
``astream`` and gives the same results. A run lowers every LCEL node onto one server graph
(executor.py) and cuts only where a Python function must see values: Python nodes and
routers (a ``SendEach`` fan-out over a constrained list is a server map instead,
fanout.py). Streams yield step by step (:meth:`CompiledGraph._steps`). Whatever the
compiler does not reproduce exactly (support.py: checkpointers, interrupts, stream modes
other than ``values``/``updates``, some channels and policies) runs on the app itself,
eagerly, with a warning: never a different result.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from langgraph._internal._config import DEFAULT_RECURSION_LIMIT
from langgraph.constants import START

from eclectus.adapters.client.meter import counting
from eclectus.adapters.langchain.compiler import CompiledRunnable, find_model
from eclectus.adapters.langchain.compiler.callbacks import fire as fire_callbacks
from eclectus.adapters.langchain.compiler.callbacks import pending_vars
from eclectus.adapters.langchain.compiler.graph import GraphTrace
from eclectus.adapters.langchain.compiler.plan import plan_text
from eclectus.adapters.langchain.compiler.runnable import run_blocking
from eclectus.adapters.langgraph.blocking import iterate_blocking
from eclectus.adapters.langgraph.executor import GraphRun, StepRecord
from eclectus.adapters.langgraph.fanout import fire_maps, map_vars
from eclectus.adapters.langgraph.routing import Chosen, settle
from eclectus.adapters.langgraph.support import (
    edge_kind,
    is_python_node,
    node_kind,
    run_unsupported,
    unsupported,
)
from eclectus.adapters.pyeval.discover import model_in_function

SWITCH_KIND = (
    "server switch (the router reads a constrained choice: it was evaluated ahead of time "
    "for each literal, each branch lowered and guarded by its literal; the server runs the "
    "taken one, no client round trip)"
)


class EagerFallbackWarning(UserWarning):
    """A graph (or one run) runs on LangGraph itself because the compiler cannot do it
    exactly; the message says why."""


class CompiledGraph:
    """The compiled form of a compiled StateGraph ``app``. ``last_graph`` is the trace of
    the most recent compiled run; ``last_frames`` the client frames it sent."""

    def __init__(self, app: Any, model: Any | None = None, app_name: str | None = None) -> None:
        self.app = app
        self.reasons = unsupported(app)
        self.model = model or self._find_model()
        if self.model is None:
            self.reasons.append("no LCEL node holds an Eclectus model (pass model=)")
        self._runner = (
            CompiledRunnable(app, self.model, app_name or app.get_name())
            if self.model is not None
            else None
        )
        self.last_graph: GraphTrace | None = None
        self.last_frames = 0

    # -- the app's surface ------------------------------------------------------------------

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """The app's ``invoke``: the output state (compiled, or eager with a warning)."""
        config = _ensure(config)
        if self._eager(config, kwargs):
            return self.app.invoke(input, config, **kwargs)
        return run_blocking(self._run(input, config, "sync"))[0]

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Async twin of :meth:`invoke`."""
        config = _ensure(config)
        if self._eager(config, kwargs):
            return await self.app.ainvoke(input, config, **kwargs)
        return (await self._run(input, config, "async"))[0]

    def batch(self, inputs: list[Any], config: Any = None, **kwargs: Any) -> list[Any]:
        """One run per input, all in one event loop (their frames interleave)."""
        configs = _configs(config, len(inputs))
        if any(self._eager(c, kwargs) for c in configs):
            return self.app.batch(inputs, config, **kwargs)
        return run_blocking(self._gather(inputs, configs, "sync"))

    async def abatch(self, inputs: list[Any], config: Any = None, **kwargs: Any) -> list[Any]:
        """Async twin of :meth:`batch`."""
        configs = _configs(config, len(inputs))
        if any(self._eager(c, kwargs) for c in configs):
            return await self.app.abatch(inputs, config, **kwargs)
        return await self._gather(inputs, configs, "async")

    def stream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stream_mode: str | list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[Any]:
        """The app's ``stream`` for modes ``values`` and ``updates`` (one or a list, then
        ``(mode, chunk)`` pairs), step by step: a step's chunks are yielded as soon as its
        values are back, while later steps still run on the server."""
        config, modes = _ensure(config), _modes(stream_mode, self.app.stream_mode)
        if self._eager(config, kwargs, modes):
            yield from self.app.stream(input, config, stream_mode=stream_mode, **kwargs)
            return
        for step in iterate_blocking(lambda: self._steps(input, config, "sync")):
            yield from _chunks([step], modes, isinstance(stream_mode, list))

    async def astream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stream_mode: str | list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        """Async twin of :meth:`stream`."""
        config, modes = _ensure(config), _modes(stream_mode, self.app.stream_mode)
        if self._eager(config, kwargs, modes):
            async for chunk in self.app.astream(input, config, stream_mode=stream_mode, **kwargs):
                yield chunk
            return
        async for step in self._steps(input, config, "async"):
            for chunk in _chunks([step], modes, isinstance(stream_mode, list)):
                yield chunk

    # -- printing ---------------------------------------------------------------------------

    def explain(self) -> str:
        """Which nodes run on the server, which are client cuts and why; then the graph the
        last run built (calls, ops, cuts) and the frames it sent (pure)."""
        if self.reasons:
            return "eager (LangGraph runs this graph): " + "; ".join(self.reasons)
        builder = self.app.builder
        lines = ["nodes:"]
        for name, spec in builder.nodes.items():
            lines.append(f"  {name}: {node_kind(spec.runnable)}")
            if not is_python_node(spec.runnable):
                lines.extend("    " + line for line in plan_text(spec.runnable).splitlines())
        lines.append("edges:")
        for start, end in sorted(builder.edges):
            lines.append(f"  {start} -> {end}: a dependency (no round trip)")
        switched = set(self.last_graph.switched) if self.last_graph is not None else set()
        for start, branches in builder.branches.items():
            for name, branch in branches.items():
                kind = SWITCH_KIND if start in switched else edge_kind(branch)
                lines.append(f"  {start} -> ? ({name}): {kind}")
        if self.last_graph is not None:
            lines.append(f"last run: {self.last_frames} client frame(s)")
            lines.append(self.last_graph.render())
        return "\n".join(lines)

    def get_graph(self, *args: Any, **kwargs: Any) -> Any:
        """The app's own drawable graph."""
        return self.app.get_graph(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CompiledGraph({self.app.get_name()})"

    # -- internals --------------------------------------------------------------------------

    def _find_model(self) -> Any | None:
        """The first Eclectus model of an LCEL node, else the first a function node,
        router or fan-out refers to (pyeval/discover.py)."""
        builder = self.app.builder
        for spec in builder.nodes.values():
            if not is_python_node(spec.runnable):
                found = find_model(spec.runnable)
                if found is not None:
                    return found
        functions = [spec.runnable for spec in builder.nodes.values()]
        functions += [b.path for branches in builder.branches.values() for b in branches.values()]
        for runnable in functions:
            for fn in (getattr(runnable, "func", None), getattr(runnable, "afunc", None)):
                found = model_in_function(fn) if fn is not None else None
                if found is not None:
                    return found
        return None

    def _eager(
        self, config: RunnableConfig, kwargs: dict[str, Any], modes: list[str] | None = None
    ) -> bool:
        reasons = list(self.reasons) + run_unsupported(dict(config), modes or [])
        # run keyword arguments (invoke's stream_mode, output_keys, ...) are LangGraph's
        reasons += [f"the run argument {k!r}" for k in kwargs]
        if reasons:
            warnings.warn(
                "eclectus compile: running eagerly: " + "; ".join(reasons),
                EagerFallbackWarning,
                stacklevel=3,
            )
        return bool(reasons)

    async def _run(
        self, input: Any, config: RunnableConfig, mode: Literal["sync", "async"]
    ) -> tuple[Any, list[StepRecord]]:
        """One compiled run: the concrete output and the concrete step records."""
        assert self._runner is not None
        with counting() as meter:  # every frame the run causes, on any session
            return await self._counted_run(input, config, mode, meter)

    async def _counted_run(
        self, input: Any, config: RunnableConfig, mode: Literal["sync", "async"], meter: Any
    ) -> tuple[Any, list[StepRecord]]:
        assert self._runner is not None
        ctx = self._runner._context(mode, config)
        run = GraphRun(self.app, ctx, config["recursion_limit"])
        try:
            output = await run.run(input)
            if isinstance(output, Chosen):  # a server switch: the taken branch's output
                output = await settle(ctx, run, output)
            records = [(step.values, step.updates) for step in run.steps]
            # with a callback handler, the calls' prompts and outputs come in this frame too
            extra = pending_vars(ctx.calls, config) + map_vars(run.maps, config)
            output, records = await ctx.resolve((output, records), extra)
        finally:
            await fire_callbacks(ctx.calls, ctx.config, mode, ctx.fetch)
            await fire_maps(run.maps, ctx.config, mode)
            self.last_graph = ctx.trace
            self.last_frames = meter.num_frames
        steps = [
            StepRecord(values, _spread_updates(updates, step.mapped))
            for (values, updates), step in zip(records, run.steps, strict=True)
        ]
        return output, steps

    async def _steps(
        self, input: Any, config: RunnableConfig, mode: Literal["sync", "async"]
    ) -> AsyncIterator[StepRecord]:
        """One compiled run, its concrete step records yielded in order as each step's
        values come back: each step is fetched (one ``get``) as soon as it is declared, so
        the first chunks arrive while later steps still run."""
        assert self._runner is not None
        with counting() as meter:  # every frame the run causes, on any session
            async for step in self._counted_steps(input, config, mode, meter):
                yield step

    async def _counted_steps(
        self, input: Any, config: RunnableConfig, mode: Literal["sync", "async"], meter: Any
    ) -> AsyncIterator[StepRecord]:
        assert self._runner is not None
        ctx = self._runner._context(mode, config)
        queue: asyncio.Queue[tuple[StepRecord, asyncio.Future[Any]] | None] = asyncio.Queue()

        def fetch_step(step: StepRecord) -> None:
            queue.put_nowait((step, asyncio.ensure_future(ctx.resolve(_record_of(step)))))

        run = GraphRun(self.app, ctx, config["recursion_limit"], on_step=fetch_step)
        driver = asyncio.ensure_future(run.run(input))
        driver.add_done_callback(lambda _: queue.put_nowait(None))
        fetches: list[asyncio.Future[Any]] = []
        try:
            while (item := await queue.get()) is not None:
                step, fetched = item
                fetches.append(fetched)
                values, updates = await fetched
                yield StepRecord(values, _spread_updates(updates, step.mapped))
            await driver  # the run's own error, after the steps before it
            extra = pending_vars(ctx.calls, config) + map_vars(run.maps, config)
            if extra:
                await ctx.resolve(None, extra)
        finally:
            for job in (driver, *fetches):
                job.cancel()
            await fire_callbacks(ctx.calls, ctx.config, mode, ctx.fetch)
            await fire_maps(run.maps, ctx.config, mode)
            self.last_graph = ctx.trace
            self.last_frames = meter.num_frames

    async def _gather(
        self, inputs: list[Any], configs: list[RunnableConfig], mode: Literal["sync", "async"]
    ) -> list[Any]:
        runs = [self._run(i, c, mode) for i, c in zip(inputs, configs, strict=True)]
        return [output for output, _ in await asyncio.gather(*runs)]


def _configs(config: Any, num: int) -> list[RunnableConfig]:
    if isinstance(config, list):
        return [_ensure(c) for c in config]
    return [_ensure(config)] * num


def _ensure(config: RunnableConfig | None) -> RunnableConfig:
    """LangChain's ensure_config, but with LangGraph's default recursion limit (much larger
    than LangChain's 25) unless the caller gave one, as the app's own run has (pure)."""
    ensured = ensure_config(config)
    given = (config or {}).get("recursion_limit")
    ensured["recursion_limit"] = given if given is not None else int(DEFAULT_RECURSION_LIMIT)
    return ensured


def _modes(stream_mode: str | list[str] | None, default: str | list[str]) -> list[str]:
    mode = stream_mode if stream_mode is not None else default
    return list(mode) if isinstance(mode, list | tuple) else [mode]


def _chunks(steps: list[StepRecord], modes: list[str], paired: bool) -> Iterator[Any]:
    """The chunks LangGraph's stream yields for ``modes``, from the run's step records."""
    for step in steps:
        for mode in modes:
            if mode == "updates":
                chunks = [{node: update} for node, update in step.updates if node != START]
            else:
                chunks = [step.values] if step.values is not None else []
            for chunk in chunks:
                yield (mode, chunk) if paired else chunk


def _record_of(step: StepRecord) -> tuple[Any, list[tuple[str, Any]]]:
    return (step.values, step.updates)


def _spread_updates(updates: list[tuple[str, Any]], mapped: list[int]) -> list[tuple[str, Any]]:
    """A step's resolved updates with each server map's one update split into its tasks'
    (``{key: [a, b]}`` -> ``{key: [a]}``, ``{key: [b]}``), as LangGraph streams the
    ``Send`` tasks one by one (pure)."""
    out: list[tuple[str, Any]] = []
    for i, (node, update) in enumerate(updates):
        if i in mapped and isinstance(update, dict) and len(update) == 1:
            ((key, items),) = update.items()
            out.extend((node, {key: [item]}) for item in items)
        else:
            out.append((node, update))
    return out


def compile(app: Any, *, model: Any | None = None, app_name: str | None = None) -> CompiledGraph:
    """Wrap a compiled StateGraph ``app`` (``builder.compile()``) so its runs go to the
    Eclectus server as one graph, cut only at Python nodes and routers. ``model``: the
    Eclectus model whose server runs the graph (default: the first in an LCEL node)."""
    return CompiledGraph(app, model, app_name)
