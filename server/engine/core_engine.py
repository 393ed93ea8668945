"""EngineCore: the engine's :class:`~eclectus.server.engine.step_loop.StepLoop`, run in the
engine core's own process.

The child's main thread runs the same step loop as AsyncEngine's step thread (same inbox,
same failure isolation); what differs is where commands come from and where outputs go. A
reader thread receives :class:`CoreCommand` messages from the pipe and submits them to the
loop; a constrained request's grammar is compiled (cached) on a worker thread first, so a slow
schema never stalls the step, and a constraint that does not compile is refused there
(:class:`RequestFailed` with ``refused``) before the request reaches the engine. The loop's
sink sends each iteration's outputs as one :class:`StepOutputs` message.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from eclectus.server.engine.core_process import ConstraintChecked, CoreCommand, StepOutputs
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm_engine import LLMEngine
from eclectus.server.engine.request import (
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestFailed,
    RequestRefused,
)
from eclectus.server.engine.step_loop import StepCommand, StepLoop


class EngineCore:
    """A step loop behind a pipe. Constructing it loads the model; :meth:`serve` steps until
    shutdown (blocking)."""

    def __init__(self, config: EngineConfig, conn: Connection) -> None:
        self.engine = LLMEngine(config)
        self._loop = StepLoop(self.engine, self._send_outputs)
        self._conn = conn
        self._send_lock = threading.Lock()  # the step thread and compile workers both send
        self._lock = threading.Lock()  # guards the two sets below
        self._compiling: set[str] = set()  # constrained adds not in the loop's inbox yet
        self._cancelled: set[str] = set()  # of those, aborted meanwhile
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="eclectus-grammar")

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (pure)."""
        return self._loop.stats

    def serve(self) -> None:
        """Read commands on a thread and step on this one until shutdown (blocking)."""
        threading.Thread(target=self._read, name="eclectus-core-reader", daemon=True).start()
        self._loop.run()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.engine.close()

    # ---- commands ---------------------------------------------------------------------------

    def _read(self) -> None:
        while True:
            try:
                command: CoreCommand = self._conn.recv()
            except (EOFError, OSError):  # the front is gone: stop, leave no orphan
                command = CoreCommand("shutdown")
            if command.kind == "shutdown":
                self._loop.stop()
                return
            self._accept(command)

    def _accept(self, command: CoreCommand) -> None:
        if command.kind == "check":
            self._pool.submit(self._check, command)
        elif command.kind == "add":
            request = command.request
            assert request is not None
            if request.sampling.structured_outputs is None:
                self._loop.submit(StepCommand("add", request.request_id, request))
            else:
                with self._lock:
                    self._compiling.add(request.request_id)
                self._pool.submit(self._add_constrained, request)
        elif command.kind == "reset_cache":
            self._loop.submit(StepCommand("reset_cache"))
        else:
            assert command.kind in ("abort", "unpin"), command.kind
            with self._lock:
                if command.request_id in self._compiling:
                    self._cancelled.add(command.request_id)
            self._loop.submit(StepCommand(command.kind, command.request_id))

    def _check(self, command: CoreCommand) -> None:
        assert command.sampling is not None
        try:
            self._loop.prepare_grammar(command.sampling)
            refusal = None
        except RequestRefused as exc:
            refusal = str(exc)
        self._post(ConstraintChecked(command.call_id, refusal))

    def _add_constrained(self, request: EngineRequest) -> None:
        """Compile ``request``'s constraint (worker thread), then queue it, or refuse it
        before anything is queued."""
        try:
            grammar = self._loop.prepare_grammar(request.sampling)
        except RequestRefused as exc:
            failed: RequestFailed | None = RequestFailed(request.request_id, str(exc), True)
        else:
            failed = None
        with self._lock:
            self._compiling.discard(request.request_id)
            cancelled = request.request_id in self._cancelled
            self._cancelled.discard(request.request_id)
        if failed is not None:
            self._post(StepOutputs((failed,), self._loop.stats))
        elif not cancelled:
            self._loop.submit(StepCommand("add", request.request_id, request, grammar))

    # ---- outputs ----------------------------------------------------------------------------

    def _send_outputs(
        self, items: Sequence[EngineOutput | RequestFailed], stats: EngineStats
    ) -> None:
        """The step loop's sink: this iteration's outputs and the stats after them as one
        message (the step thread)."""
        self._post(StepOutputs(tuple(items), stats))

    def _post(self, message: StepOutputs | ConstraintChecked) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except OSError:  # the front is gone; the reader sees it too and stops the loop
            self._loop.stop()
