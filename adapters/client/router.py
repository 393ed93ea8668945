"""Route server frames to whoever waits for them.

Everything here lives on the session's event loop (no locks; every method must be called
there). Four kinds of waiting:

- a *waiter* per variable with a get in flight: a future of its text;
- a *stream* per variable with a streamed get in flight: the text so far and the queues of
  its consumers (deltas, then the end: the final text, or an exception). One streamed get per
  variable: a second consumer joins the stream, primed with the text so far, instead of
  asking again (two streamed gets would make the server send every delta twice);
- a *reply* per client frame id (submit ack, set ack, tokens);
- a *submit record* per unacknowledged submit: which variables it declared and got.

Routing rules (the server validates a submit atomically, then acks it):

- ``value``/``delta`` go by ``var``;
- ``error`` whose ``id`` names an unacknowledged submit rejects the whole fragment: every
  variable it declared fails for good, every get it carried fails (earlier variables keep
  their state), and the reply future fails;
- an ``error`` whose ``id`` names another frame awaiting a reply (set, tokenize) fails only
  that reply;
- any other ``error`` with a ``var`` fails that variable (its producer or something upstream
  failed);
- a lost connection fails everything still waiting with ConnectionError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from eclectus.adapters.client.errors import (
    ConnectionError,
    ConnectionLost,
    EclectusClientError,
    ServerError,
    VariableFailed,
)
from eclectus.adapters.client.variables import SemanticVariable
from eclectus.protocol import Ack, Delta, Error, ServerFrame, Tokens, Value, Welcome

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The last item of a stream queue: the variable's final text."""

    text: str


StreamItem = str | StreamEnd | BaseException


@dataclass(slots=True)
class _Stream:
    queues: list[asyncio.Queue[StreamItem]]
    received: list[str]  # every delta so far, to prime a consumer that joins late


@dataclass(slots=True)
class _SubmitRecord:
    declared: list[str]
    got: list[str]


def _consume(future: asyncio.Future[object]) -> None:
    # A failed waiter nobody awaits any more must not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()


class Router:
    """In-flight bookkeeping of one session (mutated only on the session's loop)."""

    def __init__(self, lookup: Callable[[str], SemanticVariable | None]) -> None:
        self._lookup = lookup
        self._waiters: dict[str, asyncio.Future[str]] = {}
        self._asked: dict[str, set[Hashable]] = {}  # objectives of the gets in flight
        self._streams: dict[str, _Stream] = {}
        self._replies: dict[str, asyncio.Future[ServerFrame]] = {}
        self._submits: dict[str, _SubmitRecord] = {}
        self.closed: EclectusClientError | None = None

    # -- registering (before the frame that causes the answer is sent) ------------------

    def waiter(self, var_id: str, objective: Hashable = None) -> tuple[asyncio.Future[str], bool]:
        """The future of ``var_id``'s text and whether a get must be sent: when none is in
        flight, or none with this ``objective`` (criteria, deadline) — a second get with a
        stronger objective lets the server upgrade the work upstream. Mutates."""
        future = self._waiters.get(var_id)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            future.add_done_callback(_consume)
            self._waiters[var_id] = future
            self._asked[var_id] = set()
        asked = self._asked[var_id]
        is_new = objective not in asked
        asked.add(objective)
        return future, is_new

    def open_stream(self, var_id: str) -> tuple[asyncio.Queue[StreamItem], bool]:
        """A new queue receiving ``var_id``'s deltas, and whether the stream is new (a
        streamed get must be sent). Joining a stream primes the queue with the text so far.
        Mutates."""
        queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        stream = self._streams.get(var_id)
        if stream is None:
            self._streams[var_id] = _Stream([queue], [])
            return queue, True
        if stream.received:
            queue.put_nowait("".join(stream.received))
        stream.queues.append(queue)
        return queue, False

    def close_stream(self, var_id: str, queue: asyncio.Queue[StreamItem]) -> None:
        """Stops routing to ``queue`` (mutates; idempotent). The stream itself lives until
        the variable's value arrives, since its get is still in flight."""
        stream = self._streams.get(var_id)
        if stream is not None and queue in stream.queues:
            stream.queues.remove(queue)

    def is_waited(self, var_id: str) -> bool:
        """Whether a get of ``var_id`` is in flight or its stream still has a consumer
        (pure)."""
        waiter = self._waiters.get(var_id)
        stream = self._streams.get(var_id)
        return (waiter is not None and not waiter.done()) or (
            stream is not None and bool(stream.queues)
        )

    def abandon_stream(self, var_id: str) -> None:
        """Ends ``var_id``'s stream whose get was never sent: its remaining consumers get an
        error (mutates)."""
        stream = self._streams.pop(var_id, None)
        for queue in stream.queues if stream is not None else []:
            queue.put_nowait(EclectusClientError("the streamed get was abandoned before sending"))

    def expect_reply(self, frame_id: str) -> asyncio.Future[ServerFrame]:
        """A future of the reply (ack, tokens) to the frame ``frame_id`` (mutates)."""
        future: asyncio.Future[ServerFrame] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)
        self._replies[frame_id] = future
        return future

    def track_submit(self, frame_id: str, declared: list[str], got: list[str]) -> None:
        """Remembers what a submit declared and got until it is acknowledged (mutates)."""
        self._submits[frame_id] = _SubmitRecord(declared, got)

    # -- routing ------------------------------------------------------------------------

    def dispatch(self, frame: ServerFrame) -> None:
        """Delivers one server frame (mutates waiters, queues, variables)."""
        if isinstance(frame, Value):
            var = self._lookup(frame.var)
            if var is not None:
                var._resolve(frame.text, frame.usage, frame.finish_reason)
            self._finish(frame.var, frame.text)
        elif isinstance(frame, Delta):
            stream = self._streams.get(frame.var)
            if stream is not None:
                stream.received.append(frame.text)
                for queue in stream.queues:
                    queue.put_nowait(frame.text)
        elif isinstance(frame, Error):
            self._on_error(frame)
        elif isinstance(frame, Ack | Tokens):
            if frame.id is not None:
                self._submits.pop(frame.id, None)
                self._reply(frame.id, frame)
        elif isinstance(frame, Welcome):
            log.warning("ignoring a second welcome frame")

    def raise_if_closed(self) -> None:
        """ConnectionError (ConnectionLost after a loss) from the reason once
        :meth:`fail_all` ran (pure)."""
        if isinstance(self.closed, ConnectionLost):
            raise self.closed.renewed() from self.closed
        if self.closed is not None:
            raise ConnectionError(str(self.closed)) from self.closed

    def fail_all(self, error: EclectusClientError) -> None:
        """Fails everything still waiting and refuses new work (mutates; idempotent)."""
        if self.closed is None:
            self.closed = error
        for var_id in list(self._waiters):
            var = self._lookup(var_id)
            if var is not None and not self._waiters[var_id].done():
                var._fail(error)
            self._finish(var_id, error)
        for var_id in list(self._streams):
            self._finish(var_id, error)
        for frame_id in list(self._replies):
            self._reply(frame_id, error)
        self._submits.clear()

    def _on_error(self, frame: Error) -> None:
        record = self._submits.pop(frame.id, None) if frame.id is not None else None
        if record is not None:  # the whole fragment was rejected; nothing of it exists
            for var_id in record.declared:
                self._fail_var(var_id, frame)
            for var_id in record.got:
                if var_id not in record.declared:
                    self._finish(var_id, VariableFailed.from_frame(frame, var=var_id))
        elif frame.var is not None and frame.id not in self._replies:
            # a refused set/tokenize names a variable but does not fail it
            self._fail_var(frame.var, frame)
        if frame.id is not None and frame.id in self._replies:
            self._reply(frame.id, ServerError.from_frame(frame))
        elif record is None and frame.var is None:
            log.warning("server error not tied to a request: [%s] %s", frame.code, frame.message)

    def _fail_var(self, var_id: str, frame: Error) -> None:
        error = VariableFailed.from_frame(frame, var=var_id)
        var = self._lookup(var_id)
        if var is not None:
            var._fail(error)
        self._finish(var_id, error)

    def _finish(self, var_id: str, outcome: str | BaseException) -> None:
        waiter = self._waiters.pop(var_id, None)
        self._asked.pop(var_id, None)
        if waiter is not None and not waiter.done():
            if isinstance(outcome, BaseException):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)
        end: StreamItem = StreamEnd(outcome) if isinstance(outcome, str) else outcome
        stream = self._streams.pop(var_id, None)
        for queue in stream.queues if stream is not None else []:
            queue.put_nowait(end)

    def _reply(self, frame_id: str, outcome: ServerFrame | BaseException) -> None:
        future = self._replies.pop(frame_id, None)
        if future is None or future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
