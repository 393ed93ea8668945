"""The engine client (server/remote/client.py) on a real socket, against the instant engine
(benchmarks/instant_engine.py, vLLM's SSE shape): a stream read to its ``[DONE]`` gives its
connection back to the pool, and one closed early closes its connection, which is how vLLM
and SGLang learn to abort the request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eclectus.benchmarks.instant_engine import InstantEngine
from eclectus.server.remote.client import EngineClient


class CountingEngine(InstantEngine):
    """The instant engine, counting the connections it accepted and those that ended."""

    def __init__(self, token_delay_s: float = 0.0) -> None:
        super().__init__(token_delay_s)
        self.num_opened = self.num_ended = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_opened += 1
        try:
            await super().serve(reader, writer)
        finally:
            self.num_ended += 1


class ClosingEngine(CountingEngine):
    """Answers a connection's first completion; its next finds the connection closed, as a
    keep-alive connection the engine timed out just as the client reused it does."""

    def __init__(self) -> None:
        super().__init__()
        self.num_dropped = 0
        self._answered: set[asyncio.StreamWriter] = set()

    async def _answer(
        self, writer: asyncio.StreamWriter, method: str, path: str, body: dict[str, Any]
    ) -> None:
        if path == "/v1/completions" and writer in self._answered:
            self.num_dropped += 1
            writer.transport.abort()  # a reset, no answer
            raise ConnectionResetError
        self._answered.add(writer)
        await super()._answer(writer, method, path, body)


@pytest.fixture
async def engine() -> AsyncIterator[tuple[CountingEngine, str]]:
    counting = CountingEngine(token_delay_s=0.01)
    server = await asyncio.start_server(counting.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield counting, f"http://127.0.0.1:{port}/v1"


async def test_streams_read_to_their_end_share_one_connection(
    engine: tuple[CountingEngine, str],
) -> None:
    """The chunked body's end comes in a write of its own after ``[DONE]`` (as Starlette's
    does), so a client that stopped reading at ``[DONE]`` would leave each connection
    unfinished, and the pool would open one per request."""
    counting, url = engine
    client = EngineClient(url)
    try:
        for _ in range(3):
            chunks = [
                c
                async for c in client.stream_completion(
                    {"prompt": [1], "max_tokens": 4, "stream": True}
                )
            ]
            texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
            assert texts == [counting.token_text] * 4 and chunks[-1]["usage"] is not None
        assert (counting.num_completions, counting.num_opened, counting.num_ended) == (3, 1, 0)
    finally:
        await client.aclose()


async def test_a_stream_closed_early_closes_its_connection(
    engine: tuple[CountingEngine, str],
) -> None:
    counting, url = engine
    client = EngineClient(url)
    try:
        stream = client.stream_completion({"prompt": [1], "max_tokens": 1000, "stream": True})
        await anext(stream)
        await stream.aclose()  # the engine must see the connection end, not a finished read
        async with asyncio.timeout(5):
            while counting.num_ended < 1:
                await asyncio.sleep(0.01)
        chunks = [
            c
            async for c in client.stream_completion(
                {"prompt": [1], "max_tokens": 2, "stream": True}
            )
        ]
        assert len(chunks) == 3  # two tokens and the usage chunk, on a new connection
        assert (counting.num_opened, counting.num_ended) == (2, 1)
    finally:
        await client.aclose()


async def test_a_request_on_a_connection_the_engine_closed_is_sent_again() -> None:
    """Each request after the first meets its reused connection closed before any answer:
    it is sent once more on a new connection, and every stream completes."""
    closing = ClosingEngine()
    server = await asyncio.start_server(closing.serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    client = EngineClient(url)
    try:
        async with server:
            for _ in range(3):
                body = {"prompt": [1], "max_tokens": 2, "stream": True}
                chunks = [c async for c in client.stream_completion(body)]
                assert [c["choices"][0]["text"] for c in chunks if c["choices"]] == [
                    closing.token_text
                ] * 2
            assert (closing.num_completions, closing.num_dropped) == (3, 2)
            assert closing.num_opened == 3
    finally:
        await client.aclose()
