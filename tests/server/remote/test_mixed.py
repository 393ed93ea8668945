"""A chat beside a background batch through the remote backend (issue #14's mixed
workload): the chat goes to the engine at once, ahead of the batch in priority; the pool
pauses the background streams beyond its cap while the chat runs (the engine decodes the
chat beside at most that many), continues them afterwards, and their greedy text is what an
uninterrupted engine gives. Real engine process, real recording proxy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from remote_helpers import (
    EngineProcess,
    RecordingProxy,
    fan_out,
    reference,
    remote_backend,
    serve_http,
)
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server

pytestmark = pytest.mark.slow

NUM_BACKGROUND = 4
BACKGROUND_TOKENS = 160


@pytest.mark.parametrize("max_background", [1, None], ids=["cap-1", "no-cap"])
async def test_chat_beside_background_calls(
    engines: list[EngineProcess], builtin: object, max_background: int | None
) -> None:
    """Four long throughput calls stream on the engine; a latency call submitted then reaches
    the engine with a smaller priority and is answered while the four are unfinished. With
    the cap, the engine runs at most one of them beside the chat's last chunks; the paused
    ones continue (prompt + ids so far, fewer max_tokens) and end with the reference's greedy
    text. Without it, all four run beside the chat and none is paused."""
    proxy = RecordingProxy(engines[0].url)
    http, url = await serve_http(proxy.handle)
    backend = remote_backend([url], max_background_per_engine=max_background)
    background_frame = fan_out(NUM_BACKGROUND, max_tokens=BACKGROUND_TOKENS, criteria="throughput")
    try:
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            scheduler = server.scheduler
            async with connect(server.url) as bg_ws, connect(server.url) as chat_ws:
                batch, chat = RawClient(bg_ws), RawClient(chat_ws)
                await batch.hello()
                await chat.hello()
                await batch.send(background_frame)
                await _until(lambda: len(_streamed(proxy)) == NUM_BACKGROUND)
                # all four decoding (a few chunks each), not just admitted
                await _until(
                    lambda: all(len(proxy.open_at_chunk.get(i, [])) > 3 for i in _streamed(proxy))
                )
                await chat.send(fan_out(1, max_tokens=8, criteria="latency"))
                answer = await _value(chat)
                # every background call was unfinished when the chat was answered
                assert scheduler.num_inflight - scheduler.num_urgent_inflight == NUM_BACKGROUND
                assert answer["var"] == "a0"
                texts = await _values(batch, NUM_BACKGROUND)
        bodies = [proxy.bodies[i] for i in _streamed(proxy)]
        chat_index = next(i for i in _streamed(proxy) if proxy.bodies[i]["max_tokens"] == 8)
        chat_body = proxy.bodies[chat_index]
        before = [proxy.bodies[i] for i in _streamed(proxy) if i < chat_index]
        assert len(before) == NUM_BACKGROUND
        assert all(chat_body["priority"] < b["priority"] for b in before)
        # nobody watches their tokens: chunks of 16, and the continuations below stay exact
        assert all(b["stream_interval"] == 16 for b in bodies)
        beside_chat_end = proxy.open_at_chunk[chat_index][-1] - {chat_index}
        continued = [b for b in bodies if b["max_tokens"] not in (8, BACKGROUND_TOKENS)]
        if max_background is None:
            assert len(beside_chat_end) == NUM_BACKGROUND
            assert continued == [] and backend.num_preemptions == 0
        else:
            assert len(beside_chat_end) <= max_background
            assert backend.num_preemptions == NUM_BACKGROUND - max_background
            assert len(continued) == NUM_BACKGROUND - max_background
            for body in continued:  # the prompt grew by exactly the tokens it no longer asks for
                first = _first_attempt(bodies, body)
                grown = len(body["prompt"]) - len(first["prompt"])
                assert body["prompt"][: len(first["prompt"])] == first["prompt"]
                assert grown == BACKGROUND_TOKENS - body["max_tokens"] > 0
        assert texts == await reference(builtin, background_frame, NUM_BACKGROUND)
    finally:
        await http.close()
        await proxy.aclose()


def _first_attempt(bodies: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
    """The first attempt of the request ``body`` continues (its prompt is a prefix)."""
    return next(
        b
        for b in bodies
        if b["max_tokens"] == BACKGROUND_TOKENS
        and body["prompt"][: len(b["prompt"])] == b["prompt"]
    )


def _streamed(proxy: RecordingProxy) -> list[int]:
    """Indices in ``proxy.bodies`` of the generation bodies the engine received (the
    handshake's probes do not stream)."""
    return [i for i, b in enumerate(proxy.bodies) if b.get("stream")]


async def _value(client: RawClient) -> dict[str, Any]:
    answer = await client.recv(timeout=120)
    while answer["type"] != "value":
        answer = await client.recv(timeout=120)
    return answer


async def _values(client: RawClient, num: int) -> dict[str, str]:
    texts: dict[str, str] = {}
    while len(texts) < num:
        answer = await _value(client)
        texts[answer["var"]] = answer["text"]
    return texts


async def _until(condition: object, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)
