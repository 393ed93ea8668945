"""ProcessEngine: the built-in engine behind the server's Backend, its core in its own process.

As vLLM splits its API server from its EngineCore: the front (this class, in the server's
process) keeps everything the event loop needs at once — the per-request async streams, the
latest stats (requests arrive as ids: the server's front tokenized them) — and
sends add / abort / unpin / check commands down one pipe to a spawned child that owns the
``LLMEngine`` and steps it (:mod:`eclectus.server.engine.core_process`). The child answers
with one message per step; a reader thread here hands its items to the requests' streams
(:class:`~eclectus.server.engine.request_stream.StreamTable`, one ``call_soon_threadsafe``
per event loop per message).

Constrained requests are compiled where their matchers live, in the child: ``check_constraint``
asks it (blocking, as the Backend contract says), and ``generate`` lets it refuse a constraint
before anything is queued (the stream raises RequestRefused).

Faults: when the child dies, every open request fails with EngineError, and every later call
does too, at once; the server lives on and answers errors. ``shutdown`` asks the child to stop,
then terminates it if it does not; a server killed outright closes the pipe, which ends the
child as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from eclectus.protocol import SamplingParams
from eclectus.server.engine.core_process import (
    CHILD_CODE,
    ConstraintChecked,
    CoreCommand,
    CoreFailed,
    CoreReady,
    StepOutputs,
)
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.request import (
    EngineCapacity,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestFailed,
    RequestRefused,
)
from eclectus.server.engine.request_stream import StreamTable, aborted, drain

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Check:
    done: threading.Event = field(default_factory=threading.Event)
    error: EngineError | None = None


class ProcessEngine:
    """Implements ``eclectus.server.backend.Backend`` with the engine core in a child process.
    Constructing it starts the child and waits until the model is loaded (blocking); raises
    ValueError when the model cannot be found or loaded as configured."""

    def __init__(self, config: EngineConfig | None = None, *, start_timeout_s: float = 600.0):
        from eclectus.models.presets import resolve_model_dir

        self.config = config or EngineConfig()
        model_dir = resolve_model_dir(self.config.model)  # materialised once, here
        front_end, core_end = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-c", CHILD_CODE, str(core_end.fileno())],
            pass_fds=(core_end.fileno(),),
        )
        core_end.close()  # the child's end lives in the child only: EOF when it exits
        self._conn = Connection(front_end.detach())
        self._conn.send(self.config.replace(model=str(model_dir)))
        ready = self._wait_ready(start_timeout_s)
        self._stats = ready.stats
        self._max_model_len = ready.max_model_len
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._streams = StreamTable()
        self._checks: dict[int, _Check] = {}  # guarded by _lock
        self._call_ids = itertools.count()
        self._stopping = False
        self._dead: str | None = None  # why no call can succeed any more
        self._reader = threading.Thread(target=self._read, name="eclectus-core-front", daemon=True)
        self._reader.start()

    def _wait_ready(self, timeout_s: float) -> CoreReady:
        waited = 0.0
        while not self._conn.poll(1.0):
            waited += 1.0
            if self._process.poll() is not None or waited >= timeout_s:
                self._kill()
                raise RuntimeError(
                    f"the engine core process did not start (exit code {self._process.returncode})"
                )
        message = self._conn.recv()
        if isinstance(message, CoreFailed):
            self._process.wait(10)
            raise (ValueError if message.bad_config else RuntimeError)(message.message)
        assert isinstance(message, CoreReady), message
        return message

    @property
    def max_model_len(self) -> int:
        """The most tokens one request may hold, as the core reported it (pure)."""
        return self._max_model_len

    @property
    def pid(self) -> int:
        """The engine core's process id (pure)."""
        return self._process.pid

    @property
    def exit_code(self) -> int | None:
        """The core's exit status once it has exited, else None (reaps it if it has)."""
        return self._process.poll()

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Nothing to start: the core steps from construction on (raises EngineError when it
        has exited)."""
        self._raise_if_dead()

    async def shutdown(self) -> None:
        """Stop the core process (asked, then terminated after 10 s) and end every open stream
        with "abort" (mutates; idempotent)."""
        with self._lock:
            self._stopping = True
        self._post(CoreCommand("shutdown"))
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(self._process.wait, 10)
        self._kill()
        await asyncio.to_thread(self._reader.join, 10)

    def _kill(self) -> None:
        """Terminate the core if it still runs, then kill it (mutates; blocking)."""
        for stop in (self._process.terminate, self._process.kill):
            if self._process.poll() is None:
                stop()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(5)

    # ---- requests ---------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Submit ``request`` and stream its outputs until finished (mutates: enqueues).
        Raises RequestRefused for a constraint the core cannot compile, EngineError if the
        engine fails it or the core has exited; closing the iterator early aborts it."""
        stream = self._streams.open(request.request_id)  # closed once the core has exited
        self._post(CoreCommand("add", request.request_id, request))
        async with contextlib.aclosing(drain(stream, lambda: self._abandon(request))) as outputs:
            async for output in outputs:
                yield output

    def _abandon(self, request: EngineRequest) -> None:
        """Its caller stopped listening: forget its stream and abort it (mutates)."""
        self._streams.forget(request.request_id)
        self._post(CoreCommand("abort", request.request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request if it is still running and free its blocks (mutates)."""
        self._post(CoreCommand("abort", request_id))

    async def unpin(self, request_id: str) -> None:
        """Release the prefix pinned by ``request_id`` (mutates; no-op if none)."""
        self._post(CoreCommand("unpin", request_id))

    async def reset_prefix_cache(self) -> bool:
        """Empty the core's prefix cache of every block no request holds, before it takes
        the next request sent after this call (mutates: one command down the pipe, which
        the core applies in order). True, as the in-process engine's."""
        self._post(CoreCommand("reset_cache"))
        return True

    def check_constraint(self, sampling: SamplingParams) -> None:
        """Raise RequestRefused when ``sampling``'s constraint does not compile or its
        ``max_tokens`` cannot hold a valid output (blocking: the core compiles it, cached;
        call on a worker thread). EngineError when the core has exited."""
        if sampling.structured_outputs is None:
            return
        check = _Check()
        with self._lock:
            self._raise_if_dead()
            call_id = next(self._call_ids)
            self._checks[call_id] = check
        self._post(CoreCommand("check", sampling=sampling, call_id=call_id))
        check.done.wait()
        if check.error is not None:
            raise check.error

    def capacity(self) -> EngineCapacity:
        """The batch and KV pool the scheduler admits requests within (pure)."""
        return self.config.capacity(self.stats().num_total_blocks)

    def stats(self) -> EngineStats:
        """The snapshot the core sent after its latest step (pure)."""
        return self._stats

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise EngineError(self._dead)

    def _post(self, command: CoreCommand) -> None:
        try:
            with self._send_lock:
                self._conn.send(command)
        except OSError:  # the core is gone: the reader fails what is open
            pass

    # ---- the reader thread ------------------------------------------------------------------

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._on_exit()
                return
            if isinstance(message, StepOutputs):
                self._stats = message.stats  # first: an output's tokens are counted when seen
                self._streams.deliver(message.items)
            elif isinstance(message, ConstraintChecked):
                self._answer(message)

    def _answer(self, message: ConstraintChecked) -> None:
        with self._lock:
            check = self._checks.pop(message.call_id, None)
        if check is not None:
            if message.refusal is not None:
                check.error = RequestRefused(message.refusal)
            check.done.set()

    def _on_exit(self) -> None:
        """The pipe closed: the core has exited. Open requests end with "abort" after a
        shutdown, else with EngineError; so do later calls (mutates)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(5)
        with self._lock:  # from here on no check is registered
            stopping = self._stopping
            dead = (
                "the engine is shut down"
                if stopping
                else f"the engine core process exited (exit code {self._process.returncode})"
            )
            self._dead = dead
            checks, self._checks = self._checks, {}
        request_ids = self._streams.close(dead)  # nor any stream
        if not stopping:
            logger.error("%s; failing %d open requests", dead, len(request_ids))
        self._streams.deliver(
            aborted(request_id) if stopping else RequestFailed(request_id, dead)
            for request_id in request_ids
        )
        for check in checks.values():
            check.error = EngineError(dead)
            check.done.set()
