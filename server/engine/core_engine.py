"""EngineCore: the step loop of :class:`AsyncEngine`, run in the engine core's own process.

The child's main thread steps the engine exactly as AsyncEngine's step thread does (same
inbox, same failure isolation); what differs is where commands come from and where outputs
go. A reader thread receives :class:`CoreCommand` messages from the pipe and submits them to
the inbox; a constrained request's grammar is compiled (cached) on a worker thread first, so
a slow schema never stalls the step, and a constraint that does not compile is refused there
(:class:`RequestFailed` with ``refused``) before the request reaches the engine. Outputs of
one iteration are collected and sent as one :class:`StepOutputs` message.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from eclectus.server.engine.async_engine import AsyncEngine, StepCommand
from eclectus.server.engine.core_process import (
    ConstraintChecked,
    CoreCommand,
    RequestFailed,
    StepOutputs,
)
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.request import EngineError, EngineOutput, EngineRequest, RequestRefused


class EngineCore(AsyncEngine):
    """AsyncEngine's step loop behind a pipe instead of asyncio queues. Constructing it loads
    the model; :meth:`serve` steps until shutdown (blocking)."""

    def __init__(self, config: EngineConfig, conn: Connection) -> None:
        super().__init__(config)
        self._conn = conn
        self._send_lock = threading.Lock()  # the step thread and compile workers both send
        self._batch: list[EngineOutput | RequestFailed] = []  # the step thread's only
        self._compiling: set[str] = set()  # constrained adds not in the inbox yet (_cond)
        self._cancelled: set[str] = set()  # of those, aborted meanwhile (_cond)
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="eclectus-grammar")

    def serve(self) -> None:
        """Read commands on a thread and step on this one until shutdown (blocking)."""
        threading.Thread(target=self._read, name="eclectus-core-reader", daemon=True).start()
        self._run()
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
                with self._cond:
                    self._stopping = True
                    self._cond.notify()
                return
            self._accept(command)

    def _accept(self, command: CoreCommand) -> None:
        if command.kind == "check":
            self._pool.submit(self._check, command)
        elif command.kind == "add":
            request = command.request
            assert request is not None
            if request.sampling.structured_outputs is None:
                self._submit(StepCommand("add", request.request_id, request))
            else:
                with self._cond:
                    self._compiling.add(request.request_id)
                self._pool.submit(self._add_constrained, request)
        else:
            with self._cond:
                if command.request_id in self._compiling:
                    self._cancelled.add(command.request_id)
            self._submit(StepCommand(command.kind, command.request_id))

    def _check(self, command: CoreCommand) -> None:
        assert command.sampling is not None
        try:
            self._prepare_grammar(command.sampling)
            refusal = None
        except RequestRefused as exc:
            refusal = str(exc)
        self._post(ConstraintChecked(command.call_id, refusal))

    def _add_constrained(self, request: EngineRequest) -> None:
        """Compile ``request``'s constraint (worker thread), then queue it, or refuse it
        before anything is queued."""
        try:
            grammar = self._prepare_grammar(request.sampling)
        except RequestRefused as exc:
            failed: RequestFailed | None = RequestFailed(request.request_id, str(exc), True)
        else:
            failed = None
        with self._cond:
            self._compiling.discard(request.request_id)
            cancelled = request.request_id in self._cancelled
            self._cancelled.discard(request.request_id)
        if failed is not None:
            self._post(StepOutputs((failed,), self._stats))
        elif not cancelled:
            self._submit(StepCommand("add", request.request_id, request, grammar))

    # ---- outputs ----------------------------------------------------------------------------

    def _send(self, request_id: str, item: EngineOutput | EngineError, last: bool) -> None:
        """Collect one output or failure for this iteration's message (the step thread)."""
        if isinstance(item, EngineError):
            refused = isinstance(item, RequestRefused)
            self._batch.append(RequestFailed(request_id, str(item), refused))
        else:
            self._batch.append(item)

    def _flush(self) -> None:
        """Send this iteration's outputs and the stats after them as one message."""
        items, self._batch = tuple(self._batch), []
        self._post(StepOutputs(items, self._stats))

    def _post(self, message: StepOutputs | ConstraintChecked) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except OSError:  # the front is gone; the reader sees it too and stops the loop
            with self._cond:
                self._stopping = True
                self._cond.notify()
