"""A dropped connection: every pending get and stream fails at once with ConnectionLost
naming the cause, and so does any later use (docs/sdk.md, "Connection loss"). The server
killed outright, shut down cleanly, or closing with an error code."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import AsyncIterator

import pytest
from client_live import serve_live, serve_process
from client_peer import FakePeer

from eclectus.adapters.client import (
    ConnectionError,
    ConnectionLost,
    Gen,
    Session,
    VariableFailed,
    connect,
    connect_sync,
)


async def first_delta(stream: AsyncIterator[str]) -> str:
    return await anext(stream)


async def drain(stream: AsyncIterator[str]) -> None:
    """Reads the deltas already received, then whatever ends the stream."""
    async for _ in stream:
        pass


@pytest.mark.slow
async def test_killed_server_fails_pending_gets_and_streams() -> None:
    """SIGKILL mid-generation: a waiting get and an open stream raise ConnectionLost (no
    close frame: died or network) within seconds, not a hang; the session is closed."""
    with serve_process() as (url, process):
        async with connect(url, timeout=30) as app:
            (got,) = app.call(["Go on:", Gen(max_tokens=4000, ignore_eos=True)])
            (streamed,) = app.call(["And on:", Gen(max_tokens=4000, ignore_eos=True)])
            stream = streamed.astream()
            assert await first_delta(stream)
            waiting = asyncio.create_task(got.aget())
            await asyncio.sleep(0.2)  # the get is in flight
            process.send_signal(signal.SIGKILL)
            with pytest.raises(ConnectionLost) as caught:
                await asyncio.wait_for(waiting, 10)
            lost = caught.value
            assert lost.close_code is None and lost.url == url
            assert "died or the network dropped" in str(lost) and url in str(lost)
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(drain(stream), 10)
            assert app.closed
            with pytest.raises(ConnectionLost):  # later use: at once, same cause
                await streamed.aget()
            with pytest.raises(ConnectionError, match="session is closed"):
                app.call(["more", Gen()])


@pytest.mark.slow
def test_server_shutdown_fails_a_blocking_get() -> None:
    """A clean shutdown under a blocking get: the get fails with the server's answer
    (``cancelled``, the server is shutting down: docs/protocol.md, "Shutdown"), then the
    socket closes with 1001 and the session is closed, its reason saying so."""
    outcome: list[BaseException] = []
    started = threading.Event()
    with serve_live() as live:
        app = connect_sync(live.url, token=live.token)
        (long,) = app.call(["Go on:", Gen(max_tokens=4000, ignore_eos=True)])

        def wait() -> None:
            started.set()
            try:
                long.get(timeout=60)
            except BaseException as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        started.wait(5)
        deadline = time.monotonic() + 10
        while not live.server.scheduler.num_inflight and time.monotonic() < deadline:
            time.sleep(0.01)  # until it is generating
        assert live.server.scheduler.num_inflight == 1
    waiter.join(30)
    (error,) = outcome
    assert isinstance(error, VariableFailed) and error.code == "cancelled"
    assert "shutting down" in str(error)
    assert app.closed
    with pytest.raises(ConnectionError, match=r"shutting down \(close code 1001\)"):
        app.call(["more", Gen()])
    app.close()


async def test_peer_closing_with_an_error_code(peer: FakePeer, peer_app: Session) -> None:
    """A close frame with code 1011 and a reason: both reach the error."""
    peer.hold_gets = True
    (out,) = peer_app.call(["x", Gen()])
    waiting = asyncio.create_task(out.aget())
    while not peer.of_type("submit"):
        await asyncio.sleep(0.01)
    await asyncio.to_thread(peer.drop_connections)
    with pytest.raises(ConnectionLost) as caught:
        await asyncio.wait_for(waiting, 5)
    assert (caught.value.close_code, caught.value.close_reason) == (
        1011,
        "peer dropped the connection",
    )
    assert "the server failed (close code 1011" in str(caught.value)


async def test_closing_the_session_is_not_a_loss(peer: FakePeer) -> None:
    """aclose: what waits fails with a plain ConnectionError('session closed')."""
    peer.hold_gets = True
    app = await connect(peer.url)
    (out,) = app.call(["x", Gen()])
    waiting = asyncio.create_task(out.aget())
    while not peer.of_type("submit"):
        await asyncio.sleep(0.01)
    await app.aclose()
    with pytest.raises(ConnectionError, match="session closed") as caught:
        await waiting
    assert not isinstance(caught.value, ConnectionLost)
