"""A down engine behind one front (issue 27): a dropped stream probes its engine at once, and a
call that finds no engine healthy waits up to ``max_down_wait_s`` for one to come back. On
real sockets: the front server and the instant engine (benchmarks/instant_engine.py) on
loopback, in this test's event loop, so the tests can drop a stream, stop the engine and
start it again on its port."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from remote_helpers import fan_out, remote_backend, run_graph

from eclectus.benchmarks.instant_engine import STREAM_HEAD, InstantEngine
from eclectus.server.config import ServerConfig
from eclectus.server.flags import add_arguments
from eclectus.server.front.app import start_server
from eclectus.server.main import load_remote
from eclectus.server.remote import RemoteConfig
from eclectus.server.remote.backend import RemoteBackend

NUM_TOKENS = 24  # fan_out's max_tokens


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
        self.num_scrapes_to_drop = 0  # the next /metrics requests answered with a reset
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
        if path == "/metrics" and self.num_scrapes_to_drop > 0:
            self.num_scrapes_to_drop -= 1
            writer.transport.abort()  # a reset where the load scrape expected a page
            raise ConnectionResetError
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
        writer.write(STREAM_HEAD + self.token_chunk(None))
        await writer.drain()
        writer.transport.abort()  # mid-stream: the answer has begun, so no quiet resend
        raise ConnectionResetError


@pytest.fixture
async def engine() -> AsyncIterator[FlakyEngine]:
    flaky = FlakyEngine(models_delay_s=0.3)
    await flaky.start()
    yield flaky
    await flaky.stop()


def served(answers: dict[str, Any], engine: FlakyEngine) -> bool:
    """Whether every answer is a value: the engine's token, NUM_TOKENS times."""
    return all(
        a["type"] == "value" and a["text"] == engine.token_text * NUM_TOKENS
        for a in answers.values()
    )


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


async def test_a_failed_load_scrape_probes_its_engine_at_once(engine: FlakyEngine) -> None:
    """A reset on the prober's ``/metrics`` scrape (and on its one resend) marks the engine
    down, and a handshake started at once puts it back, not the next round (every 2 s
    here)."""
    backend = remote_backend([engine.url], probe_interval_s=2.0)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True):
        pool = backend.pool
        num_before = engine.num_handshakes
        engine.models_delay_s = 0.0
        engine.num_scrapes_to_drop = 2  # aiohttp sends a GET again once on a reused connection
        async with asyncio.timeout(5):
            while pool.engines[0].num_failures == 0:
                await asyncio.sleep(0.005)
        failed_at = time.monotonic()
        async with asyncio.timeout(5):
            while not pool.engines[0].healthy:
                await asyncio.sleep(0.005)
        assert time.monotonic() - failed_at < 1.0  # well within the 2 s round
        assert engine.num_handshakes == num_before + 1


async def test_calls_right_after_a_dropped_stream_are_served(engine: FlakyEngine) -> None:
    """One stream dropped by an engine that is alive: the call fails over to the same engine
    once its immediate probe passes, and the calls that arrive while that probe runs wait
    for it rather than fail (the background prober, every 30 s here, plays no part)."""
    backend = remote_backend([engine.url], probe_interval_s=30.0)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        engine.num_to_drop = 1
        first = asyncio.create_task(run_graph(server, fan_out(1), 1))
        async with asyncio.timeout(5):  # down: its probe's handshake (0.3 s) is running
            while backend.pool.engines[0].healthy:
                await asyncio.sleep(0.005)
        started = time.monotonic()
        after = await run_graph(server, fan_out(4), 4)
        assert served(after, engine), after
        assert time.monotonic() - started < 2.0  # a handshake, not a probe interval
        assert served(await first, engine)
        assert engine.num_dropped == 1 and backend.num_failovers == 1


async def test_a_dead_engine_fails_calls_after_the_bound(engine: FlakyEngine) -> None:
    """An engine that is gone: a call waits for it about ``max_down_wait_s``, then fails
    with engine_unavailable naming the engine and the wait; the server lives on."""
    backend = remote_backend([engine.url], max_down_wait_s=1.0)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        await engine.stop()
        started = time.monotonic()
        got = await run_graph(server, fan_out(1), 1)
        elapsed = time.monotonic() - started
        assert got["a0"]["type"] == "error" and got["a0"]["code"] == "engine_unavailable"
        assert engine.url in got["a0"]["message"] and "after waiting 1.0 s" in got["a0"]["message"]
        assert 1.0 <= elapsed < 2.5, elapsed
        async with httpx.AsyncClient() as http:
            health = await http.get(server.http_url + "/healthz", timeout=5)
        assert health.json()["status"] == "ok"
        await engine.start()  # for the fixture's stop


async def test_no_wait_fails_at_once(engine: FlakyEngine) -> None:
    """``max_down_wait_s=0`` keeps failing fast: engine_unavailable without waiting."""
    backend = remote_backend([engine.url], max_down_wait_s=0.0)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        await engine.stop()
        started = time.monotonic()
        got = await run_graph(server, fan_out(1), 1)
        assert got["a0"]["code"] == "engine_unavailable", got
        assert "after waiting 0.0 s" in got["a0"]["message"]
        assert time.monotonic() - started < 1.0
        await engine.start()


async def test_an_engine_back_within_the_bound_serves_the_waiting_call(
    engine: FlakyEngine,
) -> None:
    """The engine stops and starts again on its port 0.5 s later: the call that arrived in
    between waits for it (the prober finds it back) and is served, in another session beside
    one whose call was served before the stop."""
    backend = remote_backend([engine.url], max_down_wait_s=4.0)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        assert served(await run_graph(server, fan_out(1), 1), engine)
        await engine.stop()
        waiting = asyncio.create_task(run_graph(server, fan_out(2), 2))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await engine.start()
        assert served(await asyncio.wait_for(waiting, 4.0), engine)
        assert backend.pool.engines[0].healthy


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_the_wait_must_be_a_finite_non_negative_number(value: float) -> None:
    with pytest.raises(ValueError, match="max_down_wait_s must be >= 0"):
        RemoteConfig(model="tiny", engine_urls=("http://e/v1",), max_down_wait_s=value)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], 6.0), (["--engine-down-wait", "0.5"], 0.5)],  # 6: the documented default
)
def test_the_flag_reaches_the_pool(argv: list[str], expected: float) -> None:
    """``--engine-down-wait`` is the bound of the pool `eclectus serve` builds."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--engine-url", "http://127.0.0.1:9/v1", *argv])
    backend = load_remote(args, None)
    assert isinstance(backend, RemoteBackend)
    assert backend.pool.max_down_wait_s == expected
