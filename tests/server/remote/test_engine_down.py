"""A down engine behind one front (issue 27): a dropped stream probes its engine at once. On
real sockets: the front server and the instant engine (benchmarks/instant_engine.py) on
loopback, in this test's event loop, so the tests can drop a stream, stop the engine and
start it again on its port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from remote_helpers import fan_out, remote_backend, run_graph

from eclectus.benchmarks.instant_engine import InstantEngine
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server


class FlakyEngine(InstantEngine):
    """The instant engine on a port of its own, which it can drop streams on, leave
    (:meth:`stop`: connections reset, the port refused) and come back to (:meth:`start`).
    ``num_to_drop``: the next streamed completions cut after their first token by a reset
    (a dropped keep-alive connection, a proxy hiccup). ``models_delay_s``: how long
    ``GET /v1/models`` (the handshake's first step) takes to answer."""

    def __init__(self, models_delay_s: float = 0.0) -> None:
        super().__init__(token_delay_s=0.005)
        self.models_delay_s = models_delay_s
        self.num_to_drop = self.num_dropped = 0
        self.num_handshakes = 0  # GET /v1/models answered
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        """Listen on ``port`` (any free port the first time) (mutates)."""
        self._server = await asyncio.start_server(self.serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and reset every open connection, as a killed engine does."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await super().serve(reader, writer)
        finally:
            self._writers.discard(writer)

    async def _answer(
        self, writer: asyncio.StreamWriter, method: str, path: str, body: dict[str, Any]
    ) -> None:
        if path == "/v1/models":
            self.num_handshakes += 1
            await asyncio.sleep(self.models_delay_s)
        await super()._answer(writer, method, path, body)

    async def _complete(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        if not body.get("stream") or self.num_to_drop <= 0:
            await super()._complete(writer, body)
            return
        self.num_to_drop -= 1
        self.num_dropped += 1
        piece = {"index": 0, "text": self.token_text, "token_ids": [self.token_id]}
        event = b"data: %s\n\n" % json.dumps({"choices": [piece]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        writer.transport.abort()  # mid-stream: the answer has begun, so no quiet resend
        raise ConnectionResetError


@pytest.fixture
async def engine() -> AsyncIterator[FlakyEngine]:
    flaky = FlakyEngine(models_delay_s=0.3)
    await flaky.start()
    yield flaky
    await flaky.stop()


async def test_dropped_streams_probe_their_engine_once_at_once(engine: FlakyEngine) -> None:
    """Four streams dropped together: one handshake of their engine, started at once, puts
    it back in the pool (the background prober, every 30 s here, plays no part)."""
    backend = remote_backend([engine.url], probe_interval_s=30.0)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        num_before = engine.num_handshakes
        engine.num_to_drop = 4
        graph = asyncio.create_task(run_graph(server, fan_out(4), 4))
        async with asyncio.timeout(5):
            while engine.num_dropped < 4 or not backend.pool.engines[0].healthy:
                await asyncio.sleep(0.005)
        assert engine.num_handshakes == num_before + 1
        await graph
