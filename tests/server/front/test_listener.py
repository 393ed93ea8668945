"""The listening socket: connections it accepts send at once (Nagle off), with or without
SO_REUSEPORT, and a port in use is an OSError."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest
from ws_helpers import ServerFactory

from eclectus.server.front.app import bind


def _nodelay(sock: socket.socket) -> bool:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.parametrize("reuse_port", [False, True])
async def test_accepted_connections_have_nagle_off(reuse_port: bool) -> None:
    """asyncio turns Nagle off only on sockets whose proto is TCP; a listener made with
    proto 0 (socket.create_server) accepts connections that hold every small write behind
    the peer's delayed ACK."""
    accepted: list[socket.socket] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.append(transport.get_extra_info("socket"))

    listener = bind("127.0.0.1", 0, reuse_port=reuse_port)
    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    async with server:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
        for _ in range(100):
            if accepted:
                break
            await asyncio.sleep(0.01)
        assert accepted and _nodelay(accepted[0])
        writer.close()


async def test_the_servers_connections_have_nagle_off(make_server: ServerFactory) -> None:
    """End to end: a keep-alive HTTP connection the front accepted sends without Nagle
    (uvicorn writes a response's head and body in two sends)."""
    server = await make_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for _ in range(2):  # the second request on the connection is the one Nagle delayed
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await reader.readuntil(b"}")
    assert server.uvicorn is not None
    protocols = list(server.uvicorn.server_state.connections)
    sockets = [p.transport.get_extra_info("socket") for p in protocols]  # type: ignore[attr-defined]
    assert sockets and all(_nodelay(s) for s in sockets)
    writer.close()


def test_a_port_in_use_is_an_os_error_naming_the_address() -> None:
    """As socket.create_server says it: the CLI's one line names the address from it."""
    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"\('127\.0\.0\.1', {port}\)") as raised:
            bind("127.0.0.1", port)
        assert raised.value.errno == errno.EADDRINUSE
    finally:
        taken.close()
