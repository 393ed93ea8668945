"""Faults: an engine killed mid-graph, every engine gone, an engine coming back, and the
capacity the scheduler admits within as engines are up or down. The engines are real
``eclectus serve`` processes; SIGKILL drops their streams as a crash does."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from remote_helpers import (
    EngineProcess,
    fan_out,
    free_port,
    reference,
    remote_backend,
    run_graph,
)
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.server.backend import EngineCapacity
from eclectus.server.config import ServerConfig
from eclectus.server.engine import EngineConfig
from eclectus.server.front.app import start_server
from eclectus.server.remote import RemoteConfig, RoutingPolicy, build_remote_backend
from eclectus.server.remote.backend import RemoteBackend

pytestmark = pytest.mark.slow


async def wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


async def streamed_graph(
    url: str, frame: dict[str, Any], num: int, on_delta: Any
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Run ``frame`` with streaming gets: (answers, deltas per var); ``on_delta`` runs once,
    at the first delta."""
    frame = frame | {"gets": [g | {"stream": True} for g in frame["gets"]]}
    deltas: dict[str, list[str]] = {}
    answers: dict[str, Any] = {}
    async with connect(url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.send(frame)
        while len(answers) < num:
            got = await client.recv(timeout=120)
            if got["type"] == "delta":
                if not deltas:
                    await on_delta()
                deltas.setdefault(got["var"], []).append(got["text"])
            elif got["type"] in ("value", "error") and "var" in got:
                answers[got["var"]] = got
    return answers, deltas


async def test_engine_killed_mid_graph(engines: list[EngineProcess], builtin: object) -> None:
    """SIGKILL one engine while both stream: every call still completes exactly once, with
    the text an uninterrupted engine gives (the failover continues from the ids already
    streamed, nothing is duplicated); the restarted engine returns to the pool."""
    victim = engines[0]
    backend = remote_backend([e.url for e in engines], routing=RoutingPolicy.ROUND_ROBIN)
    frame = fan_out(6, max_tokens=96)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:

        async def kill_while_streaming() -> None:
            await wait_for(lambda: backend.pool.engines[0].num_inflight > 0)
            victim.kill()

        answers, deltas = await streamed_graph(server.url, frame, 6, kill_while_streaming)
        assert all(a["type"] == "value" for a in answers.values()), answers
        expected = await reference(builtin, frame, 6)
        assert {k: a["text"] for k, a in answers.items()} == expected
        assert {k: "".join(d) for k, d in deltas.items()} == expected  # nothing twice
        assert backend.num_failovers >= 1 and not backend.pool.engines[0].healthy

        victim.restart()
        await wait_for(lambda: backend.pool.engines[0].healthy)
        before = backend.pool.engines[0].num_requests
        got = await run_graph(server, fan_out(4), 4)
        assert all(a["type"] == "value" for a in got.values())
        assert backend.pool.engines[0].num_requests > before  # routed to again


async def test_no_engine_left_answers_engine_unavailable(
    engines: list[EngineProcess], builtin: object
) -> None:
    """With every engine down a call fails with engine_unavailable once it has waited
    ``max_down_wait_s`` for one, the server keeps serving, and once an engine is back calls
    succeed again."""
    backend: RemoteBackend = remote_backend([engines[1].url], max_down_wait_s=0.5)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        engines[1].kill()
        got = await run_graph(server, fan_out(1), 1)
        assert got["a0"]["type"] == "error" and got["a0"]["code"] == "engine_unavailable"
        assert engines[1].url in got["a0"]["message"]
        async with httpx.AsyncClient() as http:  # the server lives on this loop
            health = await http.get(server.http_url + "/healthz", timeout=5)
        assert health.json()["status"] == "ok"
        engines[1].restart()
        await wait_for(lambda: backend.pool.has_healthy())
        got = await run_graph(server, fan_out(1), 1)
        assert got["a0"]["text"] == (await reference(builtin, fan_out(1), 1))["a0"]


async def test_capacity_counts_the_healthy_engines(engines: list[EngineProcess]) -> None:
    """capacity() is what the healthy engines hold: their number and our cap on each,
    summed; an engine down (here unreachable from the start) adds neither; with every engine
    down, all of theirs (not unbounded: admitted calls wait for an engine to return). These
    engines' /metrics do not give their KV cache's size, so the KV is unknown (None)."""
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    backend = remote_backend([engines[0].url, nobody], max_inflight_per_engine=3)
    await backend.start()
    try:
        assert [e.healthy for e in backend.pool.engines] == [True, False]
        assert backend.capacity() == EngineCapacity(num_engines=1, max_seqs=3, kv_tokens=None)
    finally:
        await backend.shutdown()
    both = remote_backend([e.url for e in engines], max_inflight_per_engine=3)
    await both.start()
    try:
        assert both.capacity() == EngineCapacity(num_engines=2, max_seqs=6, kv_tokens=None)
        for engine in both.pool.engines:  # all down: the calls admitted wait for them
            both.pool.mark_down(engine, "test")
        assert both.capacity() == EngineCapacity(num_engines=2, max_seqs=6, kv_tokens=None)
    finally:
        await both.shutdown()


async def test_capacity_sums_the_kv_only_when_every_engine_says_it(
    engines: list[EngineProcess],
) -> None:
    """The built-in engine as a pool member says its KV cache's size (blocks x block size):
    alone, capacity()'s KV is that cache; beside an engine that does not say, it is
    unknown (None) rather than a part counted as the whole."""
    from eclectus.server.engine import AsyncEngine

    def builtin() -> AsyncEngine:
        return AsyncEngine.from_config(model="tiny", num_kv_blocks=64, num_threads=1)

    kv_tokens = 64 * EngineConfig().block_size
    for urls, expected in (
        ((), EngineCapacity(num_engines=1, max_seqs=4, kv_tokens=kv_tokens)),
        ((engines[0].url,), EngineCapacity(num_engines=2, max_seqs=8, kv_tokens=None)),
    ):
        config = RemoteConfig(
            model="tiny",
            engine_urls=urls,
            builtin=True,
            max_inflight_per_engine=4,
            probe_interval_s=0.1,
        )
        backend = build_remote_backend(config, builtin)
        await backend.start()
        try:  # the members' loads (the built-in's KV among them) come with the first scrape
            await wait_for(lambda b=backend: b.pool.engines[0].load.kv_tokens is not None)
            assert backend.capacity() == expected
        finally:
            await backend.shutdown()
