"""The remote backend against real engines: ``eclectus serve --model tiny`` processes
speaking the OpenAI-compatible API, with the graph server in this process in front of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
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
from ws_helpers import map_reduce

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, start_server
from eclectus.server.remote import RemoteConfig, RoutingPolicy, build_remote_backend

pytestmark = pytest.mark.slow


@pytest.fixture
async def front(engines: list[EngineProcess]) -> AsyncIterator[EclectusServer]:
    backend = remote_backend([e.url for e in engines])
    server = await start_server(ServerConfig(port=0), backend, owns_backend=True)
    yield server
    await server.close()


@pytest.mark.parametrize("policy", list(RoutingPolicy))
async def test_graph_through_remote_engines_equals_builtin(
    engines: list[EngineProcess], builtin: object, policy: RoutingPolicy
) -> None:
    """Greedy: a map-reduce graph and a fan-out served through two remote engines give
    exactly the built-in engine's text, under every routing policy."""
    backend = remote_backend([e.url for e in engines], routing=policy)
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        for frame, num in ((map_reduce(4), 1), (fan_out(4), 4)):
            got = await run_graph(server, frame, num)
            assert {k: v["text"] for k, v in got.items()} == await reference(builtin, frame, num)
        assert sum(e.num_requests for e in backend.pool.engines) == 5 + 4
        stats = backend.stats()  # what the server's /metrics reports as its engine
        assert stats.generated_tokens >= 4 * 24 and stats.extra["failovers"] == 0
        if policy is RoutingPolicy.ROUND_ROBIN:
            assert all(e.num_requests >= 4 for e in backend.pool.engines)


async def test_engines_receive_ids_priority_and_salt(
    engines: list[EngineProcess], builtin: object
) -> None:
    """What the engine receives (recorded by a real proxy in front of it): the prompt as the
    token ids Eclectus computed, an int priority that puts latency work before throughput
    work, the tenant as cache_salt, return_token_ids."""
    proxy = RecordingProxy(engines[0].url)
    http, url = await serve_http(proxy.handle)
    backend = remote_backend([url])
    try:
        config = ServerConfig(port=0, token="tok-d", tenant_tokens=(("acme", "tok-a"),))
        async with await start_server(config, backend, owns_backend=True) as server:
            slow = fan_out(1, criteria="throughput")
            got = await run_graph(server, slow, 1, token="tok-a")  # tenant acme
            fast = fan_out(1, criteria="latency")
            await run_graph(server, fast, 1, token="tok-d")  # tenant default
        completions = [b for b in proxy.bodies if b.get("stream")]
        assert len(completions) == 2
        throughput, latency = completions
        prompt = backend.tokenizer.encode(
            "You are a careful assistant. Answer briefly.\nQuestion 0: what is 0 plus 0?\nAnswer:"
        )
        assert throughput["prompt"] == prompt  # the flat text's ids, BOS first
        assert throughput["cache_salt"] == "acme" and latency["cache_salt"] == "default"
        assert isinstance(latency["priority"], int) and latency["priority"] < throughput["priority"]
        assert throughput["return_token_ids"] is True and throughput["max_tokens"] == 24
        assert got["a0"]["text"] == (await reference(builtin, slow, 1))["a0"]
    finally:
        await http.close()
        await proxy.aclose()


async def test_builtin_engine_joins_the_pool(engines: list[EngineProcess], builtin: object) -> None:
    """``--engine builtin`` with an ``--engine-url``: both serve calls of one graph, and the
    text is the built-in engine's alone."""
    from eclectus.server.engine import AsyncEngine

    config = RemoteConfig(
        model="tiny", engine_urls=(engines[0].url,), builtin=True, routing=RoutingPolicy.ROUND_ROBIN
    )
    backend = build_remote_backend(
        config, lambda: AsyncEngine.from_config(model="tiny", num_kv_blocks=256, num_threads=1)
    )
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        got = await run_graph(server, fan_out(4), 4)
        assert {k: v["text"] for k, v in got.items()} == await reference(builtin, fan_out(4), 4)
        assert [e.member.name for e in backend.pool.engines] == ["builtin", engines[0].url]
        assert all(e.num_requests == 2 for e in backend.pool.engines)


def test_serve_cli_in_front_of_engines(engines: list[EngineProcess], builtin: object) -> None:
    """``eclectus serve --model tiny --engine-url A --engine-url B --routing least-loaded``
    as a user runs it: a graph through it gives the built-in engine's text."""
    import json
    import re
    import signal
    import subprocess
    import sys

    from websockets.sync.client import connect as connect_sync

    flags = ["--engine-url", engines[0].url, "--engine-url", engines[1].url]
    flags += ["--routing", "least-loaded"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "eclectus", "serve", "--model", "tiny", "--port", "0", *flags],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = next(m.group(1) for line in proc.stderr if (m := re.search(r"on (ws://\S+)", line)))
        with connect_sync(url) as ws:
            ws.send(json.dumps({"type": "hello"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "welcome"
            ws.send(json.dumps(map_reduce(3)))
            while (frame := json.loads(ws.recv(timeout=120)))["type"] != "value":
                assert frame["type"] == "ack", frame
        assert frame["text"] == asyncio.run(reference(builtin, map_reduce(3), 1))["final"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def shared_document(num: int) -> dict[str, Any]:
    """``num`` questions over one document variable: every prompt starts with the document's
    segment, which the scheduler pins while the later questions are queued."""
    frame: dict[str, Any] = {
        "type": "submit",
        "vars": [{"id": "doc", "value": "A long shared document. " * 40}],
        "calls": [],
        "gets": [],
    }
    for i in range(num):
        frame["calls"].append(
            {
                "id": f"q{i}",
                "template": f"{{{{doc}}}}\nQuestion {i}: why?\nAnswer:{{{{a{i}}}}}",
                "bind": {"doc": "doc", f"a{i}": f"a{i}"},
                "sampling": {f"a{i}": {"max_tokens": 8, "ignore_eos": True}},
            }
        )
        frame["gets"].append({"var": f"a{i}"})
    return frame


@pytest.mark.parametrize("policy", [RoutingPolicy.GRAPH, RoutingPolicy.LEAST_LOADED])
async def test_graph_routing_keeps_a_shared_prefix_on_one_engine(
    engines: list[EngineProcess], builtin: object, policy: RoutingPolicy
) -> None:
    """Six questions over one document, two in flight at a time (so the later ones are still
    queued when the first is dispatched, and the scheduler pins the document's segment):
    the graph policy sends the first to the idle engine and the rest follow the pinned
    prefix there (one prefill of the document); least-loaded spreads them over both
    engines. Same text either way."""
    backend = remote_backend([e.url for e in engines], routing=policy)
    config = ServerConfig(port=0, max_inflight=2)
    async with await start_server(config, backend, owns_backend=True) as server:
        got = await run_graph(server, shared_document(6), 6)
    expected = await reference(builtin, shared_document(6), 6)
    assert {k: v["text"] for k, v in got.items()} == expected
    used = sorted(e.num_requests for e in backend.pool.engines)
    if policy is RoutingPolicy.GRAPH:
        assert used == [0, 6]
        # followers placed while the pin lives follow it; one placed after the last sharer's
        # dispatch released the pin follows the cached prefix instead
        decisions = backend.pool.decisions
        assert decisions["least-loaded"] == 1 and decisions["pinned-prefix"] >= 1
        assert decisions["pinned-prefix"] + decisions["prefix"] == 5
        assert all(not e.pins for e in backend.pool.engines)  # unpinned once all went out
    else:
        assert used[0] > 0


async def test_engine_answering_5xx_fails_over(
    engines: list[EngineProcess], builtin: object
) -> None:
    """An engine that passes its checks but answers 503 to every generation: each call it
    gets fails over to the other engine and completes once; it is marked down."""
    proxy = RecordingProxy(engines[0].url, fail_streams=True)
    http, url = await serve_http(proxy.handle)
    backend = remote_backend([url, engines[1].url], routing=RoutingPolicy.ROUND_ROBIN)
    try:
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            got = await run_graph(server, fan_out(4), 4)
        assert {k: v["text"] for k, v in got.items()} == await reference(builtin, fan_out(4), 4)
        assert backend.num_failovers >= 1 and backend.pool.engines[0].num_failures >= 1
    finally:
        await http.close()
        await proxy.aclose()
