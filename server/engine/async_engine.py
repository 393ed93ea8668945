"""AsyncEngine: the built-in engine behind the server's Backend interface.

One background thread runs the engine's :class:`~eclectus.server.engine.step_loop.StepLoop`
(step while work exists, sleep when idle; a step that raises fails only its requests). The
event loop talks to it only through the loop's thread-safe inbox (add, abort, unpin); each
iteration's outputs come back through a :class:`~eclectus.server.engine.request_stream.StreamTable`
into one asyncio.Queue per request, with one ``loop.call_soon_threadsafe`` per event loop.

A constrained request's grammar is compiled (cached) and its matcher built on a worker
thread before the request reaches the inbox, so a slow-to-compile schema never stalls the
other requests' steps; a constraint that does not compile is refused there, as the client's
mistake (RequestRefused, ``bad_request``), before anything is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from eclectus.protocol import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm_engine import LLMEngine
from eclectus.server.engine.request import (
    EngineCapacity,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestFailed,
)
from eclectus.server.engine.request_stream import StreamTable, aborted, drain
from eclectus.server.engine.step_loop import StepCommand, StepLoop

_SHUT_DOWN = "the engine is shut down"


class AsyncEngine:
    """Implements ``eclectus.server.backend.Backend``. Constructing it loads the model."""

    def __init__(
        self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None
    ) -> None:
        self.config = config or (engine.config if engine else EngineConfig())
        self.engine = engine if engine is not None else LLMEngine(self.config)
        self._streams = StreamTable()
        self._loop = StepLoop(self.engine, self._deliver)
        self._lock = threading.Lock()  # the step thread's start and stop
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, config: EngineConfig | None = None, **overrides: Any) -> AsyncEngine:
        """Build from a config and/or keyword overrides (``model="tiny"``, ...)."""
        base = config or EngineConfig()
        return cls(base.replace(**overrides) if overrides else base)

    @property
    def max_model_len(self) -> int:
        """The most tokens one request may hold: the window, and the KV pool (pure)."""
        return self.engine.max_model_len

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the step thread (mutates; idempotent)."""
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._loop.stopping:
                raise EngineError(_SHUT_DOWN)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop.run, name="eclectus-engine", daemon=True
                )
                self._thread.start()

    async def shutdown(self) -> None:
        """Stop and join the step thread, then end every open stream with "abort"
        (mutates; idempotent)."""
        with self._lock:
            self._loop.stop()
            thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join)
        request_ids = self._streams.close(_SHUT_DOWN)
        # the thread is gone: the engine is ours now
        self._streams.deliver(self.engine.abort(i) or aborted(i) for i in request_ids)
        self.engine.close()

    # ---- requests ---------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Submit ``request`` and stream its outputs until finished (mutates: enqueues).
        Raises EngineError if the engine fails it; closing the iterator early aborts it."""
        self._ensure_thread()
        grammar = None
        if request.sampling.structured_outputs is not None:  # compiled here, not on the step
            grammar = await asyncio.to_thread(self._loop.prepare_grammar, request.sampling)
        stream = self._streams.open(request.request_id)
        self._loop.submit(StepCommand("add", request.request_id, request, grammar))
        async with contextlib.aclosing(drain(stream, lambda: self._abandon(request))) as outputs:
            async for output in outputs:
                yield output

    def _abandon(self, request: EngineRequest) -> None:
        """Its caller stopped listening: forget its stream and abort it (mutates)."""
        self._streams.forget(request.request_id)
        self._loop.submit(StepCommand("abort", request.request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request if it is still running and free its blocks (mutates)."""
        self._loop.submit(StepCommand("abort", request_id))

    async def unpin(self, request_id: str) -> None:
        """Release the prefix pinned by ``request_id`` (mutates; no-op if none)."""
        self._loop.submit(StepCommand("unpin", request_id))

    async def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache of every block no request holds, before the step loop
        takes the next request submitted after this call (mutates). True: blocks in use
        stay cached, and the rest always go."""
        self._loop.submit(StepCommand("reset_cache"))
        return True

    def check_constraint(self, sampling: SamplingParams) -> None:
        """Raise RequestRefused when ``sampling``'s constraint does not compile or its
        ``max_tokens`` cannot hold a valid output (blocking: compiles, cached; any thread)."""
        self._loop.prepare_grammar(sampling)

    def capacity(self) -> EngineCapacity:
        """The batch and KV pool the scheduler admits requests within (pure)."""
        return self.config.capacity(self.stats().num_total_blocks)

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (pure)."""
        return self._loop.stats

    def _deliver(self, items: Sequence[EngineOutput | RequestFailed], stats: EngineStats) -> None:
        """The step loop's sink: each item to its request's stream (the step thread)."""
        self._streams.deliver(items)
