"""Run the session's coroutines from any event loop or thread.

A session lives on one event loop: the caller's (``connect``) or a background thread's
(``connect_sync``, or the adapters' connection: :class:`LoopThread`). Its futures and socket
belong to that loop, so work is always executed there. Called from that same loop, a
coroutine is simply awaited; from another loop it goes through
``asyncio.run_coroutine_threadsafe`` and is awaited with ``asyncio.wrap_future`` (cancelling
the waiter cancels the work); from a plain thread it blocks on the result. This is the one
bridge between sync and async code: an adapter's logic is async, and its sync entry points
(``invoke``, ``complete``) block on the same coroutines through it, from any thread,
including one whose own event loop is running (a Jupyter cell).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from eclectus.adapters.client.errors import ConnectionError

T = TypeVar("T")
_DONE = object()  # end of a bridged async iterator (StopAsyncIteration cannot cross a future)


class LoopThread:
    """A daemon thread running one event loop until :meth:`stop`; :attr:`bridge` runs work
    there."""

    def __init__(self, name: str = "eclectus-session") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        assert self._thread.ident is not None
        self.bridge = LoopBridge(self.loop, self._thread.ident)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def stop(self) -> None:
        """Stops and closes the loop, then joins the thread (mutates; idempotent)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def stop_when_idle(self) -> None:
        """Stops the loop once no task is left on it (mutates; returns at once, from any
        thread): for a loop whose owner is gone while work it started may still run."""
        with contextlib.suppress(RuntimeError):  # the loop is closed already
            asyncio.run_coroutine_threadsafe(self._stop_after_work(), self.loop)

    async def _stop_after_work(self) -> None:
        me = asyncio.current_task()
        while others := {task for task in asyncio.all_tasks() if task is not me}:
            await asyncio.wait(others)
        asyncio.get_running_loop().stop()


class LoopBridge:
    """Executes coroutine factories on one loop. Holds no state but the loop's identity."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int) -> None:
        self._loop = loop
        self._thread_id = thread_id

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError as exc:  # the loop is closed
            coro.close()
            raise ConnectionError("the session's event loop is closed") from exc

    async def run(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Awaits ``factory()`` on the session's loop, from whatever loop is running."""
        if asyncio.get_running_loop() is self._loop:
            return await factory()
        return await asyncio.wrap_future(self._submit(factory()))

    def block(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float | None) -> T:
        """Runs ``factory()`` on the session's loop and waits for it in this thread. Raises
        RuntimeError on the loop's own thread (it would deadlock) and TimeoutError after
        ``timeout`` seconds (the work is then cancelled)."""
        if threading.get_ident() == self._thread_id:
            raise RuntimeError(
                "blocking call on the session's own event-loop thread would deadlock; "
                "use the async form (await var.aget()) or a session from connect_sync()"
            )
        future = self._submit(factory())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    async def aiter(self, source: AsyncIterator[T]) -> AsyncIterator[T]:
        """Iterates ``source`` (an async iterator bound to the session's loop) from any loop;
        closes it on the session's loop when the consumer stops early."""
        try:
            while True:
                item = await self.run(lambda: _next_or_done(source))
                if item is _DONE:
                    return
                yield item  # type: ignore[misc]
        finally:
            if hasattr(source, "aclose") and not self._loop.is_closed():
                await self.run(source.aclose)

    def iter_blocking(self, source: AsyncIterator[T], timeout: float | None) -> Iterator[T]:
        """Blocking twin of :meth:`aiter`; ``timeout`` bounds each item's wait."""
        try:
            while True:
                item = self.block(lambda: _next_or_done(source), timeout)
                if item is _DONE:
                    return
                yield item  # type: ignore[misc]
        finally:
            if hasattr(source, "aclose") and not self._loop.is_closed():
                self.block(source.aclose, timeout)


async def _next_or_done(source: AsyncIterator[T]) -> T | object:
    try:
        return await anext(source)
    except StopAsyncIteration:
        return _DONE
