"""A chat beside a background batch through the remote backend (issue #14's mixed
workload): the chat goes to the engine at once, ahead of the batch in priority, and is
answered while the batch still runs. Real engine process, real recording proxy."""

from __future__ import annotations

import asyncio

import pytest
from remote_helpers import EngineProcess, RecordingProxy, fan_out, remote_backend, serve_http
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.server.app import start_server
from eclectus.server.config import ServerConfig

pytestmark = pytest.mark.slow

NUM_BACKGROUND = 4


async def test_chat_is_not_held_behind_background_calls(engines: list[EngineProcess]) -> None:
    """Four long throughput calls are in flight on the engine; a latency call submitted then
    reaches the engine while all four are still streaming (no wait in Eclectus's queue or
    the pool), with a smaller vLLM priority, and its answer comes before theirs."""
    proxy = RecordingProxy(engines[0].url)
    http, url = await serve_http(proxy.handle)
    backend = remote_backend([url])
    try:
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            scheduler = server.scheduler
            async with connect(server.url) as bg_ws, connect(server.url) as chat_ws:
                batch, chat = RawClient(bg_ws), RawClient(chat_ws)
                await batch.hello()
                await chat.hello()
                await batch.send(fan_out(NUM_BACKGROUND, max_tokens=400, criteria="throughput"))
                await _until(lambda: len(_streamed(proxy)) == NUM_BACKGROUND)
                await chat.send(fan_out(1, max_tokens=8, criteria="latency"))
                answer = await chat.recv(timeout=120)
                while answer["type"] != "value":
                    answer = await chat.recv(timeout=120)
                # every background call was still in flight when the chat was answered
                assert scheduler.num_inflight - scheduler.num_urgent_inflight == NUM_BACKGROUND
                assert answer["var"] == "a0"
        bodies = _streamed(proxy)
        assert len(bodies) == NUM_BACKGROUND + 1
        chat_body = bodies[-1]
        assert chat_body["max_tokens"] == 8
        assert all(chat_body["priority"] < b["priority"] for b in bodies[:-1])
    finally:
        await http.close()
        await proxy.aclose()


def _streamed(proxy: RecordingProxy) -> list[dict[str, object]]:
    """The generation bodies the engine received (the handshake's probes do not stream)."""
    return [b for b in proxy.bodies if b.get("stream")]


async def _until(condition: object, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)
