"""Caps that fit a front: by load and by tenant, not by address; a session refused for load
comes back as a retryable refusal that the SDK and the adapters retry with backoff, bounded,
over real sockets."""

from __future__ import annotations

import asyncio
import time

import pytest
from ws_helpers import ServerFactory

from eclectus.adapters.client import SessionRefused, connect, connect_sync
from eclectus.adapters.connection import Connection
from eclectus.server.config import ServerConfig


def test_defaults_cap_load_not_addresses() -> None:
    """No per-address cap by default; total connections and sessions are capped."""
    config = ServerConfig()
    assert config.max_connections_per_client is None
    assert config.max_connections >= 1024 and config.max_sessions >= 1024


async def test_many_sessions_from_one_address(make_server: ServerFactory) -> None:
    """300 sessions at once from one address (the old per-address cap was 128, the old
    per-tenant cap 128): all open, with auth off."""
    server = await make_server()
    sessions = await asyncio.gather(*(connect(server.url, retries=0) for _ in range(300)))
    assert len(server.ctx.sessions) == 300
    await asyncio.gather(*(s.aclose() for s in sessions))


async def test_refused_session_is_retried_until_a_slot_frees(make_server: ServerFactory) -> None:
    """At max_sessions the second session is refused, retried with backoff, and opens once
    the first closes."""
    server = await make_server(max_sessions=1)
    first = await connect(server.url)
    second = asyncio.ensure_future(connect(server.url, retries=12))
    await asyncio.sleep(0.4)
    assert not second.done()
    refused = server.metrics.rejected_frames["limit_exceeded"]
    assert refused >= 1  # it was refused at least once, and is still trying
    await first.aclose()
    session = await asyncio.wait_for(second, 10)
    assert session.session_id and len(server.ctx.sessions) == 1
    await session.aclose()


async def test_retries_are_bounded(make_server: ServerFactory) -> None:
    """A server that stays at its cap: after ``retries`` retries the refusal is raised,
    one clear error that says so."""
    server = await make_server(max_sessions=1)
    async with connect(server.url):
        with pytest.raises(SessionRefused, match=r"1 sessions open \(refused 3 times\)") as info:
            await connect(server.url, retries=2)
    assert info.value.code == "limit_exceeded" and info.value.retries == 2
    assert server.metrics.rejected_frames["limit_exceeded"] == 3


async def test_connection_cap_429_is_retried(make_server: ServerFactory) -> None:
    """At max_connections the upgrade gets HTTP 429; the SDK retries it and gets in once a
    connection is given back."""
    server = await make_server(max_connections=1)
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    opening = asyncio.ensure_future(connect(server.url, retries=12))
    await asyncio.sleep(0.4)
    assert not opening.done() and server.guard.num_refused >= 1
    writer.close()
    await writer.wait_closed()
    session = await asyncio.wait_for(opening, 10)
    await session.aclose()


async def test_per_tenant_cap_holds_with_auth(make_server: ServerFactory) -> None:
    """With tenants, one tenant's sessions stop at its cap while another tenant's open."""
    tokens = (("alice", "tok-a"), ("bob", "tok-b"))
    server = await make_server(tenant_tokens=tokens, max_sessions_per_tenant=1)
    async with connect(server.url, token="tok-a"):
        with pytest.raises(SessionRefused, match="sessions of this tenant"):
            await connect(server.url, token="tok-a", retries=0)
        async with connect(server.url, token="tok-b") as bob:
            assert bob.session_id


async def test_adapter_session_is_retried(make_server: ServerFactory) -> None:
    """The adapters' shared connection (what ChatEclectus and Eclectus use) retries too: a
    blocking first use while the server is full waits for a slot instead of failing."""
    server = await make_server(max_sessions=1)
    holder = await connect(server.url)
    connection = Connection(server.url, None, "retry-app")
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    opening = loop.run_in_executor(None, lambda: connection.session)
    await asyncio.sleep(0.4)
    await holder.aclose()
    session = await asyncio.wait_for(opening, 10)
    assert time.monotonic() - started >= 0.4 and not session.closed
    await loop.run_in_executor(None, connection.close)  # blocking: off the server's loop


def test_connect_sync_refuses_negative_retries() -> None:
    with pytest.raises(ValueError, match="retries must be >= 0"):
        connect_sync("ws://127.0.0.1:1", retries=-1)
