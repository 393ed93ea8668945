"""``iterate_blocking``: an async iterator consumed from sync code, item by item.

The compiled ``stream`` yields each step's chunks as they come back; its sync twin cannot
await, so the async iterator runs on a helper thread's own event loop (as ``run_blocking``
runs a coroutine) and hands items over through a queue. Closing the sync iterator early
stops the async one (its ``finally`` runs on the helper thread).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = object()


def iterate_blocking(make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """The items of ``make()``, in order, each as soon as it is produced; its exception is
    raised here after the items before it."""
    items: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()

    async def pump() -> None:
        iterator = make()
        try:
            async for item in iterator:
                items.put(("item", item))
                if stop.is_set():
                    break
        except BaseException as exc:  # re-raised on the consumer's thread
            items.put(("error", exc))
        finally:
            await iterator.aclose()  # type: ignore[attr-defined]
            items.put(("done", _DONE))

    thread = threading.Thread(target=lambda: asyncio.run(pump()), name="eclectus-stream")
    thread.start()
    try:
        while True:
            kind, value = items.get()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        stop.set()
        thread.join()
