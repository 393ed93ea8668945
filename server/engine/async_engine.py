"""AsyncEngine: the built-in engine behind the server's Backend interface.

One background thread owns the LLMEngine and steps it while work exists, sleeping on a
condition when idle. The event loop talks to it only through a thread-safe inbox (add, abort,
unpin), drained at the start of each iteration; outputs travel back by
``loop.call_soon_threadsafe`` into one asyncio.Queue per request. A step that raises fails only
the requests in that step (their iterators raise EngineError); a request whose own parameters
break sampling fails alone; the loop keeps going.

A constrained request's grammar is compiled (cached) and its matcher built on a worker
thread before the request reaches the inbox, so a slow-to-compile schema never stalls the
other requests' steps; a constraint that does not compile is refused there, as the client's
mistake (RequestRefused, ``bad_request``), before anything is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eclectus.protocol import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm_engine import LLMEngine, StepFailed
from eclectus.server.engine.request import (
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestRefused,
)
from eclectus.server.engine.request_stream import RequestStream, aborted, drain

if TYPE_CHECKING:  # xgrammar is imported on the first constrained request
    from eclectus.server.engine.structured import GrammarState

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepCommand:
    """What the event loop (or the engine core's pipe reader) asks of the step thread;
    applied in arrival order at the start of the next iteration."""

    kind: str  # "add" | "abort" | "unpin"
    request_id: str
    request: EngineRequest | None = None
    grammar: GrammarState | None = None  # "add": its matcher, built off the step thread


class AsyncEngine:
    """Implements ``eclectus.server.backend.Backend``. Constructing it loads the model."""

    def __init__(
        self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None
    ) -> None:
        self.config = config or (engine.config if engine else EngineConfig())
        self.engine = engine if engine is not None else LLMEngine(self.config)
        self._cond = threading.Condition()
        self._inbox: list[StepCommand] = []  # guarded by _cond
        self._streams: dict[str, RequestStream] = {}  # guarded by _cond
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stats = self.engine.stats()  # replaced (never mutated) after every step

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
        with self._cond:
            if self._stopping:
                raise EngineError("the engine is shut down")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="eclectus-engine", daemon=True
                )
                self._thread.start()

    async def shutdown(self) -> None:
        """Stop and join the step thread, then end every open stream with "abort"
        (mutates; idempotent)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join)
        with self._cond:
            request_ids = list(self._streams)
        for request_id in request_ids:  # the thread is gone: the engine is ours now
            self._deliver(self.engine.abort(request_id) or aborted(request_id))
        self.engine.close()

    # ---- requests ---------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Submit ``request`` and stream its outputs until finished (mutates: enqueues).
        Raises EngineError if the engine fails it; closing the iterator early aborts it."""
        self._ensure_thread()
        grammar = None
        if request.sampling.structured_outputs is not None:  # compiled here, not on the step
            grammar = await asyncio.to_thread(self._prepare_grammar, request.sampling)
        stream = RequestStream.here()
        with self._cond:
            if request.request_id in self._streams:
                raise EngineError(f"request id {request.request_id!r} is already running")
            self._streams[request.request_id] = stream
        self._submit(StepCommand("add", request.request_id, request, grammar))
        abort = StepCommand("abort", request.request_id)
        async with contextlib.aclosing(drain(stream, lambda: self._submit(abort))) as outputs:
            async for output in outputs:
                yield output

    async def abort(self, request_id: str) -> None:
        """Abort a request if it is still running and free its blocks (mutates)."""
        self._submit(StepCommand("abort", request_id))

    async def unpin(self, request_id: str) -> None:
        """Release the prefix pinned by ``request_id`` (mutates; no-op if none)."""
        self._submit(StepCommand("unpin", request_id))

    def check_constraint(self, sampling: SamplingParams) -> None:
        """Raise RequestRefused when ``sampling``'s constraint does not compile or its
        ``max_tokens`` cannot hold a valid output (blocking: compiles, cached; any thread)."""
        self._prepare_grammar(sampling)

    def _prepare_grammar(self, sampling: SamplingParams) -> GrammarState | None:
        try:
            return self.engine.prepare_grammar(sampling)
        except ValueError as exc:  # GrammarError: what xgrammar refused, or the budget
            raise RequestRefused(str(exc)) from None

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (pure)."""
        return self._stats

    def _submit(self, command: StepCommand) -> None:
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    # ---- the step thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self.engine.has_unfinished and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                commands, self._inbox = self._inbox, []
            for command in commands:
                self._apply(command)
            if self.engine.has_unfinished:
                self._step()  # refreshes the stats itself, before delivering
            else:
                self._stats = self.engine.stats()
            self._flush()

    def _flush(self) -> None:
        """End of one iteration of the step thread: outputs are delivered one by one as they
        come, so nothing is left to send here; the engine core process batches (mutates)."""

    def _apply(self, command: StepCommand) -> None:
        if command.kind == "add":
            assert command.request is not None
            try:
                self.engine.add_request(command.request, command.grammar)
            except Exception as exc:  # bad request or tokenizer error: fail it, live on
                self._fail(command.request_id, f"{type(exc).__name__}: {exc}")
        elif command.kind == "abort":
            output = self.engine.abort(command.request_id)
            if output is not None:
                self._deliver(output)
        else:
            self.engine.unpin(command.request_id)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except StepFailed as exc:
            logger.exception("engine step failed; failing its %d requests", len(exc.request_ids))
            outputs = exc.outputs
            for request_id in exc.request_ids:
                self._fail(request_id, str(exc))
        except Exception as exc:  # a bug outside the forward: fail everything in flight
            logger.exception("engine loop error; failing all requests")
            with self._cond:  # the engine's own ids too: a core process has no streams
                request_ids = sorted(set(self._streams) | set(self.engine.request_ids))
            for request_id in request_ids:
                self.engine.abort(request_id)
                self._fail(request_id, f"engine error: {exc}")
            outputs = []
        # counters first: whoever reads stats() after seeing an output must see its tokens
        self._stats = self.engine.stats()
        for output in outputs:
            if output.finish_reason == "error":  # failed alone by its own parameters
                self._fail(output.request_id, self.engine.pop_failure(output.request_id))
            else:
                self._deliver(output)

    def _fail(self, request_id: str, message: str) -> None:
        self._send(request_id, EngineError(message), last=True)

    def _deliver(self, output: EngineOutput) -> None:
        self._send(output.request_id, output, last=output.finished)

    def _send(self, request_id: str, item: EngineOutput | EngineError, last: bool) -> None:
        with self._cond:
            stream = self._streams.pop(request_id, None) if last else self._streams.get(request_id)
        if stream is None:
            return
        # a RuntimeError means the caller's loop is closed: nobody is listening
        with contextlib.suppress(RuntimeError):
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
