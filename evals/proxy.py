"""A loopback TCP proxy that adds a client network's round-trip time to every exchange.

Each chunk read from the client reaches the server ``rtt/2`` later, and each chunk from the
server reaches the client ``rtt/2`` later, in order, so one request-response exchange costs one
RTT more, as over a wide-area link; the paper applied such a delay to every call of both
systems. A new connection also pays the TCP handshake's round trip, as over any network: its
first chunk reaches the server one RTT later still (a client's ``connect`` returns at once
here, so the proxy holds what it sends instead of the SYN/SYN-ACK). A client that keeps its
connections open pays that once; one that opens new ones (an HTTP client per model object, or
after vLLM closed an idle keep-alive connection, 5 s) pays it on each. Per direction,
a reader stamps chunks with their delivery time into a bounded queue (backpressure when it
is full) and a writer sends them when due. Listens on 127.0.0.1 only.

It also counts what crosses it (:class:`Traffic`): connections, chunks and bytes each way,
and the client's *turns* -- chunks the client sent after the server's last delivery to it on
that connection (or opening it). A client that waits for a reply before it sends again
pays one round trip per turn, so turns bound the round trips a run paid from above: a
WebSocket session's upgrade (which carries the ``hello``) is one, each compiled graph's
``submit`` one, each stock HTTP request one.

    with DelayProxy("127.0.0.1", 8000, rtt_s=0.1) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/v1"
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

CHUNK_BYTES = 1 << 16
MAX_QUEUED_CHUNKS = 256  # per direction: a bound on what the proxy holds


@dataclass(frozen=True, slots=True)
class Traffic:
    """What crossed a :class:`DelayProxy` (totals since it started; subtract two snapshots
    for one run's share)."""

    connections: int = 0
    turns: int = 0  # client chunks sent after hearing from the server (see the module doc)
    chunks_up: int = 0  # client -> server
    chunks_down: int = 0  # server -> client
    bytes_up: int = 0
    bytes_down: int = 0
    # summed over the turns: seconds from the server's last delivery to the client until
    # the client sent (its code's time, not the network's); a connection's first turn, and
    # the first after :meth:`DelayProxy.new_run`, add none
    client_s: float = 0.0

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(
            *(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self))
        )


class _Counter:
    """The proxy's running totals; mutated on the proxy's loop, read from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = Traffic()

    def add(self, **deltas: float) -> None:
        """Add ``deltas`` (field name -> amount) to the totals (mutates)."""
        with self._lock:
            t = self._totals
            self._totals = dataclasses.replace(
                t, **{name: getattr(t, name) + amount for name, amount in deltas.items()}
            )

    def snapshot(self) -> Traffic:
        with self._lock:
            return self._totals


@dataclass(eq=False, slots=True)
class _Link:
    """One proxied connection's turn-taking: has the client heard from the server since it
    last sent? (Mutated on the proxy's loop.)"""

    counter: _Counter
    heard: bool = True  # the connection's first chunk is a turn
    heard_at: float | None = None  # when the client last got a server chunk

    def sent_up(self, size: int) -> None:
        if not self.heard:
            self.counter.add(chunks_up=1, bytes_up=size)
            return
        self.heard = False
        waited = 0.0 if self.heard_at is None else time.monotonic() - self.heard_at
        self.counter.add(turns=1, chunks_up=1, bytes_up=size, client_s=waited)

    def read_down(self, size: int) -> None:
        self.counter.add(chunks_down=1, bytes_down=size)

    def delivered_down(self, size: int) -> None:
        self.heard, self.heard_at = True, time.monotonic()


def _ignore(size: int) -> None:
    pass


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay_s: float,
    on_read: Callable[[int], None] = _ignore,
    on_delivered: Callable[[int], None] = _ignore,
    first_extra_s: float = 0.0,
) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay_s`` after it was read, in order (the
    first ``first_extra_s`` later still: later chunks queue behind it); ``on_read`` /
    ``on_delivered`` hear each chunk's size when it is read / written."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_QUEUED_CHUNKS)

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
            on_delivered(len(data))
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(deliver())
    try:
        extra = first_extra_s
        while data := await reader.read(CHUNK_BYTES):
            on_read(len(data))
            await queue.put((time.monotonic() + delay_s + extra, data))
            extra = 0.0
    except OSError:
        pass
    finally:
        await queue.put((0.0, b""))
        with contextlib.suppress(OSError):
            await sender


class DelayProxy:
    """Forwards 127.0.0.1:``port`` (a free port) to ``host``:``target_port`` with ``rtt_s``
    of added round-trip delay, plus one ``rtt_s`` for each new connection's handshake unless
    ``handshake`` is False; runs its own event loop in a daemon thread. ``close`` (or leaving
    the ``with`` block) stops it (mutates; idempotent). :meth:`traffic` says what crossed it
    so far."""

    def __init__(
        self, host: str, target_port: int, rtt_s: float, *, handshake: bool = True
    ) -> None:
        if rtt_s < 0:
            raise ValueError(f"rtt_s must be >= 0, got {rtt_s}")
        self.host, self.target_port, self.rtt_s = host, target_port, rtt_s
        self.handshake = handshake
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._counter = _Counter()
        self._links: set[_Link] = set()  # open connections (the proxy's loop owns it)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="delay-proxy", daemon=True
        )
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._server = future.result(timeout=10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    def traffic(self) -> Traffic:
        """Totals of what crossed the proxy so far (pure snapshot, any thread)."""
        return self._counter.snapshot()

    def new_run(self) -> None:
        """Start a new run (mutates): the next turn on each open connection adds no client
        time, since the time since its last answer was spent between runs, not in one."""

        async def forget() -> None:
            for link in self._links:
                link.heard_at = None

        asyncio.run_coroutine_threadsafe(forget(), self._loop).result(timeout=10)

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
        link = _Link(self._counter)
        self._links.add(link)
        self._counter.add(connections=1)
        try:
            await asyncio.gather(
                _pump(
                    client_r,
                    server_w,
                    half,
                    on_read=link.sent_up,
                    first_extra_s=self.rtt_s if self.handshake else 0.0,
                ),
                _pump(server_r, client_w, half, link.read_down, link.delivered_down),
                return_exceptions=True,
            )
        except asyncio.CancelledError:
            # close() drops connections still open (a client's idle keep-alive, an open
            # session): end quietly, or asyncio logs the cancelled task's traceback
            pass
        finally:
            self._links.discard(link)
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
