"""Requests' output streams, as both built-in engines hand them to the event loop.

AsyncEngine's step thread and ProcessEngine's pipe reader hand what the engine produced
(outputs, and the failures that end requests) to one :class:`StreamTable`, which puts each
into its request's :class:`RequestStream` with one ``call_soon_threadsafe`` per event loop per
batch; :func:`drain` is the loop side both ``generate`` methods share: it yields outputs until
the finished one and calls the engine's ``abandon`` the moment a caller stops listening early.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from eclectus.server.engine.request import EngineError, EngineOutput, RequestFailed

_Item = EngineOutput | EngineError


@dataclass(slots=True)
class RequestStream:
    """Where one request's outputs arrive: the loop of the task that asked, and its queue.
    Build it on that loop (:meth:`here`); other threads put only via ``loop``."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[EngineOutput | EngineError] = field(default_factory=asyncio.Queue)

    @classmethod
    def here(cls) -> RequestStream:
        """A stream for the running loop (pure; call on the loop)."""
        return cls(asyncio.get_running_loop())


async def drain(stream: RequestStream, abandon: Callable[[], None]) -> AsyncIterator[EngineOutput]:
    """Yield ``stream``'s outputs up to the finished one; raise the EngineError that ends it.

    Closed before the end, it calls ``abandon()`` (the engine's abort) inside ``aclose``, so
    the caller must close it deterministically: ``async with contextlib.aclosing(drain(...))``
    aborts as the caller's own generator closes, not when the loop finalises this one later.
    """
    finished = False
    try:
        while not finished:
            item = await stream.queue.get()
            if isinstance(item, EngineError):
                finished = True
                raise item
            finished = item.finished
            yield item
    finally:
        if not finished:  # the caller stopped listening: free what it holds
            abandon()


def aborted(request_id: str) -> EngineOutput:
    """The last output of a request the engine dropped without running it to the end (pure)."""
    return EngineOutput(request_id, "", (), finished=True, finish_reason="abort")


class StreamTable:
    """The open requests' streams by request id (thread-safe). After :meth:`close` it
    registers nothing more: a later :meth:`open` raises EngineError with the reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, RequestStream] = {}  # guarded by _lock
        self._closed: str | None = None  # why nothing opens any more

    def open(self, request_id: str) -> RequestStream:
        """Register a stream for ``request_id`` on the running loop (mutates). Raises
        EngineError when the id is already open or the table is closed."""
        stream = RequestStream.here()
        with self._lock:
            if self._closed is not None:
                raise EngineError(self._closed)
            if request_id in self._streams:
                raise EngineError(f"request id {request_id!r} is already running")
            self._streams[request_id] = stream
        return stream

    def forget(self, request_id: str) -> None:
        """Drop ``request_id``'s stream: its caller stopped listening (mutates)."""
        with self._lock:
            self._streams.pop(request_id, None)

    def close(self, reason: str) -> list[str]:
        """Open nothing from now on; the ids still open, whose streams the caller must end
        (mutates; the first reason stays)."""
        with self._lock:
            self._closed = self._closed or reason
            return list(self._streams)

    def deliver(self, items: Iterable[EngineOutput | RequestFailed]) -> None:
        """Hand each item to its request's stream, in order; a finished output or a failure
        closes it. One callback per event loop (mutates; any thread)."""
        puts: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, _Item]]] = {}
        with self._lock:
            for item in items:
                last = isinstance(item, RequestFailed) or item.finished
                get = self._streams.pop if last else self._streams.get
                stream = get(item.request_id, None)
                if stream is not None:
                    value = item.error() if isinstance(item, RequestFailed) else item
                    puts.setdefault(stream.loop, []).append((stream, value))
        for loop, batch in puts.items():
            # a RuntimeError means the caller's loop is closed: nobody is listening
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[RequestStream, _Item]]) -> None:
    for stream, item in batch:
        stream.queue.put_nowait(item)
