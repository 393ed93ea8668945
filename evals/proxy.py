"""A loopback TCP proxy that adds a client network's round-trip time to every exchange.

Each chunk read from the client reaches the server ``rtt/2`` later, and each chunk from the
server reaches the client ``rtt/2`` later, in order, so one request-response exchange costs one
RTT more, as over a wide-area link; the paper applied such a delay to every call of both
systems. Per direction, a reader stamps chunks with their delivery time into a bounded queue
(backpressure when it is full) and a writer sends them when due. Listens on 127.0.0.1 only.

    with DelayProxy("127.0.0.1", 8000, rtt_s=0.1) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/v1"
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from types import TracebackType

CHUNK_BYTES = 1 << 16
MAX_QUEUED_CHUNKS = 256  # per direction: a bound on what the proxy holds


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay_s`` after it was read, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_QUEUED_CHUNKS)

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(CHUNK_BYTES):
            await queue.put((time.monotonic() + delay_s, data))
    except OSError:
        pass
    finally:
        await queue.put((0.0, b""))
        with contextlib.suppress(OSError):
            await sender


class DelayProxy:
    """Forwards 127.0.0.1:``port`` (a free port) to ``host``:``target_port`` with ``rtt_s``
    of added round-trip delay; runs its own event loop in a daemon thread. ``close`` (or
    leaving the ``with`` block) stops it (mutates; idempotent)."""

    def __init__(self, host: str, target_port: int, rtt_s: float) -> None:
        if rtt_s < 0:
            raise ValueError(f"rtt_s must be >= 0, got {rtt_s}")
        self.host, self.target_port, self.rtt_s = host, target_port, rtt_s
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="delay-proxy", daemon=True
        )
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._server = future.result(timeout=10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._on_client, "127.0.0.1", 0)

    async def _on_client(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_w.close()
            return
        half = self.rtt_s / 2
        try:
            await asyncio.gather(
                _pump(client_r, server_w, half),
                _pump(server_r, client_w, half),
                return_exceptions=True,
            )
        except asyncio.CancelledError:
            # close() drops connections still open (a client's idle keep-alive, an open
            # session): end quietly, or asyncio logs the cancelled task's traceback
            pass
        finally:
            for writer in (server_w, client_w):
                writer.close()

    def close(self) -> None:
        """Stop listening, drop open connections, stop the loop (mutates; idempotent)."""
        if self._server is None:
            return
        server, self._server = self._server, None

        async def stop() -> None:
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> DelayProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
