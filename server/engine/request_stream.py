"""One request's output stream, as both built-in engines hand it to the event loop.

AsyncEngine's step thread and ProcessEngine's pipe reader put a request's outputs (or the
EngineError that ends it) into its :class:`RequestStream` with ``call_soon_threadsafe``;
:func:`drain` is the loop side both ``generate`` methods share: it yields outputs until the
finished one and calls the engine's ``abandon`` the moment a caller stops listening early.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from eclectus.server.engine.request import EngineError, EngineOutput


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
