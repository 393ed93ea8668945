"""Coarse streams for calls nobody watches, through real ``eclectus serve`` engines (which
honour ``stream_interval`` as vLLM does): the body carries the field only for unwatched
calls, the front receives far fewer chunks, and greedy text is exactly what interval 1 and
an uninterrupted built-in engine give, a failover included (tokens generated but not yet
streamed when an engine dies are generated again by the continuation)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from remote_helpers import (
    EngineProcess,
    RecordingProxy,
    fan_out,
    reference,
    remote_backend,
    run_graph,
    serve_http,
)
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server
from eclectus.server.remote import RoutingPolicy

pytestmark = pytest.mark.slow

NUM_CALLS = 4
MAX_TOKENS = 64


def watched_first(num: int, max_tokens: int) -> dict[str, Any]:
    """``fan_out``, with a streaming get on ``a0`` only."""
    frame = fan_out(num, max_tokens=max_tokens)
    frame["gets"] = [g | {"stream": g["var"] == "a0"} for g in frame["gets"]]
    return frame


async def test_unwatched_calls_stream_coarsely_with_the_same_text(
    engines: list[EngineProcess], builtin: object
) -> None:
    """Interval 16 against 1, same graph: the watched call's body has no stream_interval,
    the others carry 16; the texts equal the built-in engine's; the front parses fewer
    than half the chunks."""
    proxy = RecordingProxy(engines[0].url)
    http, url = await serve_http(proxy.handle)
    frame = watched_first(NUM_CALLS, MAX_TOKENS)
    expected = await reference(builtin, frame, NUM_CALLS)
    num_pieces: dict[int, int] = {}
    try:
        for interval in (1, 16):
            backend = remote_backend([url])
            config = ServerConfig(port=0, engine_stream_interval=interval)
            async with await start_server(config, backend, owns_backend=True) as server:
                first_body = len(proxy.bodies)
                answers = await run_graph(server, frame, NUM_CALLS)
                num_pieces[interval] = backend.num_pieces
            assert {k: a["text"] for k, a in answers.items()} == expected
            bodies = [b for b in proxy.bodies[first_body:] if b.get("stream")]
            sent = sorted(b.get("stream_interval", 1) for b in bodies)
            assert sent == ([1] * NUM_CALLS if interval == 1 else [1] + [16] * (NUM_CALLS - 1))
    finally:
        await http.close()
        await proxy.aclose()
    # a call streams each token, then its finish and its usage chunks; a coarse one its
    # first token, the other 63 in chunks of 16 (the last of them with the final output)
    each = MAX_TOKENS + 2
    assert num_pieces[1] == NUM_CALLS * each
    coarse = (NUM_CALLS - 1) * (1 + math.ceil((MAX_TOKENS - 1) / 16) + 2) + each
    assert num_pieces[16] <= coarse < num_pieces[1] // 2


async def test_a_late_streaming_get_receives_coarse_deltas(engines: list[EngineProcess]) -> None:
    """A streaming get sent once its call is in the engine (dispatched unwatched) gets the
    text from then on in chunks of about 16 tokens, then the whole value."""
    proxy = RecordingProxy(engines[0].url)
    http, url = await serve_http(proxy.handle)
    frame = fan_out(1, max_tokens=MAX_TOKENS)
    try:
        backend = remote_backend([url])
        async with (
            await start_server(ServerConfig(port=0), backend, owns_backend=True) as server,
            connect(server.url) as ws,
        ):
            client = RawClient(ws)
            await client.hello()
            await client.send(frame)
            while not any(b.get("stream") for b in proxy.bodies):
                await asyncio.sleep(0.005)
            await client.send({"type": "get", "var": "a0", "stream": True})
            deltas: list[str] = []
            values: list[str] = []
            while len(values) < 2:  # both gets are answered
                got = await client.recv(timeout=120)
                if got["type"] == "delta":
                    deltas.append(got["text"])
                elif got["type"] == "value":
                    values.append(got["text"])
    finally:
        await http.close()
        await proxy.aclose()
    assert values[0] == values[1] and values[0].endswith("".join(deltas))
    assert [b["stream_interval"] for b in proxy.bodies if b.get("stream")] == [16]
    assert len(deltas) <= math.ceil(MAX_TOKENS / 16) + 1


async def test_failover_of_coarse_streams_is_exact(
    engines: list[EngineProcess], builtin: object
) -> None:
    """SIGKILL one engine while it streams unwatched calls in chunks of 16: every call
    completes with the uninterrupted engine's greedy text (the continuation starts from the
    ids received; those generated but not yet sent are generated again)."""
    victim = engines[0]
    backend = remote_backend([e.url for e in engines], routing=RoutingPolicy.ROUND_ROBIN)
    frame = fan_out(6, max_tokens=96)
    try:
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            graph = asyncio.ensure_future(run_graph(server, frame, 6))
            while not (backend.pool.engines[0].num_inflight and backend.num_pieces > 6):
                assert not graph.done(), "the graph ended before the kill"
                await asyncio.sleep(0.005)
            victim.kill()
            answers = await graph
        assert backend.num_failovers >= 1
        assert {k: a["text"] for k, a in answers.items()} == await reference(builtin, frame, 6)
    finally:
        victim.restart()
