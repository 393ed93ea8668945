"""CompiledRunnable: a chain that runs as one graph on the Eclectus server.

``invoke`` lowers the chain over the input (every supported runnable declares server work,
nothing is sent), then asks for the final output: the whole graph goes in one submit frame
and only the final values come back. ``batch`` lowers every input into the same graph
(independent paths) and fetches all outputs in one frame. Where a runnable cannot be lowered,
the graph upstream of it is resolved, the runnable runs on the client, and its output joins
the graph as constant text (a cut; see :meth:`CompiledRunnable.explain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, Literal, TypeVar

from langchain_core.messages import AIMessageChunk
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import ensure_config

from eclectus.adapters.calls import Caller
from eclectus.adapters.client import SyncSession
from eclectus.adapters.client.variables import VarState
from eclectus.adapters.connection import connection_for, ws_url
from eclectus.adapters.langchain.compiler.callbacks import fire as fire_callbacks
from eclectus.adapters.langchain.compiler.callbacks import pending_vars
from eclectus.adapters.langchain.compiler.context import Lowering, cut_gate
from eclectus.adapters.langchain.compiler.graph import GraphTrace
from eclectus.adapters.langchain.compiler.plan import plan_text
from eclectus.adapters.langchain.compiler.registry import lower
from eclectus.adapters.langchain.compiler.symbols import ai_message, collect_refs, rebuild
from eclectus.adapters.langchain.pieces import Ref, SymMessage

T = TypeVar("T")

CANCEL_WAIT_S = 2.0  # how long an interrupted run waits for the server to drop its calls


class CompiledRunnable(Runnable[Any, Any]):
    """The compiled form of ``runnable``: same inputs and outputs, one graph per run.

    ``model`` is the Eclectus model whose server (URL, token) runs the graph; models of
    another server inside the chain run as cuts. Thread-safe; ``last_graph`` is the trace
    of the most recent run (for printing).
    """

    def __init__(self, runnable: Runnable, model: Any, app: str | None = None) -> None:
        self.runnable = runnable
        self.model = model
        self.app = app or model.app_name or runnable.get_name()
        self.server = (ws_url(model.eclectus_url), model.token)
        self.last_graph: GraphTrace | None = None

    # -- Runnable surface ----------------------------------------------------------------

    def get_name(self, suffix: str | None = None, *, name: str | None = None) -> str:
        return name or f"Compiled{self.runnable.get_name(suffix)}"

    @property
    def InputType(self) -> Any:
        return self.runnable.InputType

    @property
    def OutputType(self) -> Any:
        return self.runnable.OutputType

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self.batch([input], config, **kwargs)[0]

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return (await self.abatch([input], config, **kwargs))[0]

    def batch(
        self,
        inputs: list[Any],
        config: Any = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """All inputs as one graph: independent paths, outputs fetched in one frame."""

        def run(items: list[Any], config: list[RunnableConfig]) -> list[Any]:
            return run_blocking(self._run(items, config, "sync", return_exceptions))

        return self._batch_with_config(run, inputs, config, return_exceptions=return_exceptions)

    async def abatch(
        self,
        inputs: list[Any],
        config: Any = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Async twin of :meth:`batch`."""

        async def run(items: list[Any], config: list[RunnableConfig]) -> list[Any]:
            return await self._run(items, config, "async", return_exceptions)

        return await self._abatch_with_config(
            run, inputs, config, return_exceptions=return_exceptions
        )

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """Streams the final output's text when it is one generated value (a string or an
        AIMessage, as chunks); otherwise yields the whole output once."""
        ctx = self._context("sync", ensure_config(config))
        output = run_blocking(lower(self.runnable, input, ctx))
        self.last_graph = ctx.trace
        ref = _final_ref(output)
        if ref is None:
            yield run_blocking(ctx.resolve(output))
            return
        parts: list[str] = []
        caller = self._caller()
        for delta in caller.iterate(caller.adeltas(ref.var)):
            parts.append(delta)
            yield AIMessageChunk(content=delta) if isinstance(output, SymMessage) else delta
        if isinstance(output, SymMessage):
            yield _closing_chunk(output, "".join(parts))

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Async twin of :meth:`stream`."""
        ctx = self._context("async", ensure_config(config))
        output = await lower(self.runnable, input, ctx)
        self.last_graph = ctx.trace
        ref = _final_ref(output)
        if ref is None:
            yield await ctx.resolve(output)
            return
        parts: list[str] = []
        async for delta in self._caller().adeltas(ref.var):
            parts.append(delta)
            yield AIMessageChunk(content=delta) if isinstance(output, SymMessage) else delta
        if isinstance(output, SymMessage):
            yield _closing_chunk(output, "".join(parts))

    # -- printing ------------------------------------------------------------------------

    def plan(self) -> str:
        """The static plan: which runnables lower onto the server and which are cuts."""
        return plan_text(self.runnable)

    def explain(self) -> str:
        """The plan, then the graph the last run built (calls, ops, cuts)."""
        built = self.last_graph.render() if self.last_graph else "graph: not run yet"
        return f"{self.plan()}\n{built}"

    def __repr__(self) -> str:
        return f"CompiledRunnable({self.runnable!r})"

    # -- internals -----------------------------------------------------------------------

    def _caller(self) -> Caller:
        """The shared client layer for this run's session, with the model's options
        (criteria, deadline, timeout) for what the run asks for itself."""
        connection = connection_for(self.model.eclectus_url, self.model.token, self.app)
        return Caller(connection, self.model.call_options())

    def _session(self) -> SyncSession:
        return self._caller().session

    def _context(
        self,
        mode: Literal["sync", "async"],
        config: RunnableConfig,
        trace: GraphTrace | None = None,
        cuts: asyncio.Semaphore | None = None,
    ) -> Lowering:
        trace = trace or GraphTrace()
        timeout = self.model.request_timeout
        objective = self.model.call_options()
        cuts = cuts or cut_gate(config)
        return Lowering(self._session(), self.server, mode, config, trace, timeout, objective, cuts)

    async def _run(
        self,
        inputs: list[Any],
        configs: list[RunnableConfig],
        mode: Literal["sync", "async"],
        return_exceptions: bool,
    ) -> list[Any]:
        trace, cuts = GraphTrace(), cut_gate(configs[0])
        contexts = [self._context(mode, config, trace, cuts) for config in configs]
        try:
            outputs = await asyncio.gather(
                *(
                    lower(self.runnable, item, ctx)
                    for item, ctx in zip(inputs, contexts, strict=True)
                ),
                return_exceptions=return_exceptions,
            )
            self.last_graph = trace
            extra = [v for ctx in contexts for v in pending_vars(ctx.calls, ctx.config)]
            results = await _resolve_all(contexts[0], list(outputs), return_exceptions, extra)
        except asyncio.CancelledError:
            # interrupted (Ctrl-C): stop the calls on the server, as closing an eager call's
            # HTTP request aborts it, and skip the callbacks, which would wait for them
            await _cancel_pending(contexts)
            raise
        except BaseException:
            await _fire_all(contexts, mode)
            raise
        await _fire_all(contexts, mode)
        return results


async def _cancel_pending(contexts: list[Lowering]) -> None:
    """Cancels the run's calls still pending on the server, waiting at most
    ``CANCEL_WAIT_S`` for the acknowledgements (an interrupted run must not hang on a server
    that stopped answering). Mutates the server's graph."""
    pending = [
        record.ref.var
        for ctx in contexts
        for record in ctx.calls
        if record.ref.var.state is VarState.PENDING
    ]
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CANCEL_WAIT_S):
            await asyncio.gather(*(var.acancel() for var in pending), return_exceptions=True)


async def _fire_all(contexts: list[Lowering], mode: Literal["sync", "async"]) -> None:
    """The model callbacks of every declared call, as the eager run fires them."""
    for ctx in contexts:
        await fire_callbacks(ctx.calls, ctx.config, mode, ctx.fetch)


async def _resolve_all(
    ctx: Lowering, outputs: list[Any], return_exceptions: bool, extra: list[Any] = ()
) -> list[Any]:
    """Every output's concrete value, all refs fetched in one frame (with the ``extra``
    variables callbacks need). With ``return_exceptions``, a failure is returned in place of
    the outputs it affects."""
    live = [o for o in outputs if not isinstance(o, BaseException)]
    refs = collect_refs(live, [])
    try:
        wanted = [ref.var for ref in refs] + [v for v in extra if v.state is VarState.PENDING]
        texts = (await ctx.fetch(wanted))[: len(refs)] if wanted else []
    except Exception:
        if not return_exceptions:
            raise
        return [await _resolve_or_error(ctx, o) for o in outputs]
    table = {id(ref): text for ref, text in zip(refs, texts, strict=True)}
    return [o if isinstance(o, BaseException) else rebuild(o, table) for o in outputs]


async def _resolve_or_error(ctx: Lowering, output: Any) -> Any:
    if isinstance(output, BaseException):
        return output
    try:
        return await ctx.resolve(output)
    except Exception as exc:
        return exc


def _final_ref(output: Any) -> Ref | None:
    if isinstance(output, SymMessage):
        return output.ref
    return output if isinstance(output, Ref) else None


def _closing_chunk(output: SymMessage, text: str) -> AIMessageChunk:
    """The last chunk of a streamed chat output: usage and metadata, no text."""
    message = ai_message(output, text)
    return AIMessageChunk(
        content="",
        usage_metadata=message.usage_metadata,
        response_metadata=message.response_metadata,
        chunk_position="last",
    )


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine to completion from sync code, also under a running event loop (then
    on a helper thread, since the loop's own thread must not block on itself)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="eclectus-compiled-run")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
