"""Connection-level limits, below the ASGI application: how many TCP connections the server
holds (all clients together) and, when configured, one client address may hold, and how
long a connection may take to send a request head.

uvicorn's HTTP protocol waits forever for a half-sent head and takes any number of
connections per address; these subclasses of its protocols add both limits (the WebSocket one
only gives the connection back when it ends, since an upgraded connection changes protocol
object). The counts are kept per transport, so a connection is released exactly once.

HTTP is parsed by httptools (llhttp, in C), as vLLM's and uvicorn's default ``auto`` choose:
every streamed token leaves as one SSE chunk, and h11's pure-Python event machinery cost
the front more per chunk than everything else it does (docs/benchmarks.md, #28 part 2).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

# a request head still unfinished past this many bytes is refused: h11's default and its
# rule, which the server used before (a longer head that arrives whole in one read is
# parsed, as h11 did; llhttp itself takes heads of any length)
MAX_HEAD_BYTES = 16 << 10
_TOO_LONG = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
    b"connection: close\r\n\r\n"
)
_TOO_MANY_BODY = b"too many connections; retry later\n"
_TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\n"
    + f"content-length: {len(_TOO_MANY_BODY)}\r\nconnection: close\r\n\r\n".encode()
    + _TOO_MANY_BODY
)


@dataclass(slots=True)
class ConnectionGuard:
    """Open connections, per client address and in all. Mutating methods say so; event loop
    only."""

    max_per_client: int | None  # None: no per-address cap
    head_timeout_s: float
    max_total: int = 4096
    per_address: Counter[str] = field(default_factory=Counter)
    open_transports: dict[int, str] = field(default_factory=dict)  # id(transport) -> address
    num_refused: int = 0  # connections refused at the cap, for /metrics
    num_head_timeouts: int = 0

    def open(self, transport: asyncio.BaseTransport, address: str) -> bool:
        """Admit a new connection from ``address`` unless the server or the address holds
        its cap (mutates)."""
        at_total = len(self.open_transports) >= self.max_total
        per_client = self.max_per_client
        if at_total or (per_client is not None and self.per_address[address] >= per_client):
            self.num_refused += 1
            return False
        self.per_address[address] += 1
        self.open_transports[id(transport)] = address
        return True

    def close(self, transport: asyncio.BaseTransport) -> None:
        """Give back a connection's slot; idempotent (mutates)."""
        address = self.open_transports.pop(id(transport), None)
        if address is None:
            return
        self.per_address[address] -= 1
        if self.per_address[address] <= 0:
            del self.per_address[address]

    def protocols(self) -> tuple[type[asyncio.Protocol], type[asyncio.Protocol]]:
        """uvicorn's (http, ws) protocol classes with this guard's limits (pure)."""
        return _guarded_http(self), _guarded_ws(self)


def _guarded_http(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    class GuardedHttpProtocol(HttpToolsProtocol):
        """HttpToolsProtocol with a per-address cap, and a deadline and a size limit for
        every request head."""

        _head_timer: asyncio.TimerHandle | None = None
        _armed_cycle: object = None
        _head_bytes = 0  # received since the armed cycle's head began, while it is unfinished
        _upgraded = False  # a WebSocket took the connection over

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            address = self.client[0] if self.client else "unknown"
            if not guard.open(transport, address):
                transport.write(_TOO_MANY)
                transport.close()
                return
            self._arm_head_timer()

        def _arm_head_timer(self) -> None:
            """The next request head must be complete within the deadline: the timer closes
            the connection unless a new request cycle began since it was armed."""
            self._cancel_head_timer()
            self._armed_cycle = self.cycle
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(guard.head_timeout_s, self._head_timeout)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.cycle is self._armed_cycle and not self.transport.is_closing():
                guard.num_head_timeouts += 1
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._upgraded or self.cycle is not self._armed_cycle or self.transport.is_closing():
                return  # a head completed (what follows it is the body's, limited elsewhere)
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._cancel_head_timer()
                self.transport.write(_TOO_LONG)
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_head_timer()

        def handle_websocket_upgrade(self) -> None:
            self._cancel_head_timer()  # the WebSocket protocol takes over (hello deadline)
            self._upgraded = True
            super().handle_websocket_upgrade()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            guard.close(self.transport)
            super().connection_lost(exc)

    return GuardedHttpProtocol


def _guarded_ws(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
        """The upgraded connection: gives its slot back when it ends."""

        def connection_lost(self, exc: Exception | None) -> None:
            guard.close(self.transport)
            super().connection_lost(exc)

    return GuardedWebSocketProtocol
