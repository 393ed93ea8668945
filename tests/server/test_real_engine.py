"""End to end with the built-in engine (AsyncEngine, tiny model), built once per module."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
from websockets.asyncio.client import connect
from ws_helpers import RawClient, map_reduce

from eclectus.server.front.app import EclectusServer
from eclectus.server.front.metrics import parse_prometheus

pytestmark = pytest.mark.slow


async def session(server: EclectusServer) -> tuple[RawClient, object]:
    ws = await connect(server.url)
    client = RawClient(ws)
    await client.hello()
    return client, ws


async def test_graph_equals_calls_one_by_one(real_server: EclectusServer) -> None:
    """Values are text: the server-side graph gives what running each call in turn gives."""
    client, ws = await session(real_server)
    await client.ask(map_reduce(3))
    graph_final = (await client.values(1))["final"]["text"]
    sums = []
    for i in range(3):
        one = map_reduce(3)
        one["calls"] = [one["calls"][i]]
        one["ops"], one["gets"] = [], [{"var": f"y{i}"}]
        one["vars"] = [one["vars"][i] | {"id": f"x{i}"}]
        one["calls"][0] = one["calls"][0] | {"id": f"one{i}"}
        one["calls"][0]["bind"] = {"doc": f"x{i}", "summary": f"y{i}"}
        assert (await client.ask(one))["type"] == "ack"
        sums.append((await client.values(1))[f"y{i}"]["text"])
    reduce = map_reduce(3)["calls"][-1] | {"id": "r2", "bind": {"all": "j2", "final": "f2"}}
    await client.ask(
        {
            "type": "submit",
            "vars": [{"id": "j2", "value": "\n".join(sums)}],
            "calls": [reduce],
            "gets": [{"var": "f2"}],
        }
    )
    assert (await client.values(1))["f2"]["text"] == graph_final
    await ws.close()  # type: ignore[attr-defined]


async def test_stream_and_multi_output(real_server: EclectusServer) -> None:
    client, ws = await session(real_server)
    call = {
        "id": "c",
        "template": "Q: hello\nA:{{a}}\nQ: again\nA:{{b}}",
        "bind": {"a": "a", "b": "b"},
        "sampling": {
            "a": {"max_tokens": 5, "ignore_eos": True},
            "b": {"max_tokens": 5, "ignore_eos": True},
        },
    }
    await client.ask({"type": "submit", "calls": [call]})
    await client.send({"type": "get", "var": "b", "stream": True})
    deltas = []
    while (frame := await client.recv(timeout=30))["type"] == "delta":
        deltas.append(frame["text"])
    assert frame["type"] == "value" and "".join(deltas) == frame["text"]
    assert frame["usage"]["completion_tokens"] == 5
    assert (await client.ask({"type": "get", "var": "a"}))["type"] == "value"
    await ws.close()  # type: ignore[attr-defined]


async def test_disconnects_leave_no_blocks_held(
    real_server: EclectusServer, real_engine: object
) -> None:
    """Sessions leaving mid-generation: requests aborted, pins released, all blocks free."""
    for _ in range(5):
        client, ws = await session(real_server)
        frame = map_reduce(3)
        for spec in frame["calls"]:
            spec["sampling"] = {
                k: {"max_tokens": 200, "ignore_eos": True} for k in spec["sampling"]
            }
        await client.ask(frame)
        await asyncio.sleep(0.05)
        await ws.close()  # type: ignore[attr-defined]
    for _ in range(200):
        stats = real_server.backend.stats()
        if (
            real_server.metrics.sessions == 0
            and stats.num_running == 0
            and stats.num_free_blocks == stats.num_total_blocks
        ):
            break
        await asyncio.sleep(0.05)
    stats = real_server.backend.stats()
    assert real_server.metrics.sessions == 0
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.extra.get("num_pinned", 0) == 0


async def test_shared_prefix_hits_the_cache(real_server: EclectusServer) -> None:
    client, ws = await session(real_server)
    before = real_server.backend.stats().cache_hit_tokens
    frame = map_reduce(4)
    for spec in frame["calls"][:4]:
        spec["template"] = "You are a careful summarizer of documents. " * 10 + spec["template"]
    await client.ask(frame)
    await client.values(1)
    text = real_server.metrics_text()
    hits = parse_prometheus(text)["eclectus_prefix_cache_hit_tokens_total"]
    assert hits - before >= 3 * 100  # three of four maps reuse the ~130-token prefix
    await ws.close()  # type: ignore[attr-defined]


async def test_server_tokenizes_each_prompt_once_with_the_engines_ids(
    real_engine: object, real_server: EclectusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner ships the ids it counted for the limit, computed once by the front on the
    event loop (short prompts): the flat prompt text's ids, as transformers' tokenizer(text)
    gives them (BOS first); the engine takes them as they are."""
    seen: list[object] = []
    engine_core = real_engine.engine  # type: ignore[attr-defined]
    original = engine_core.add_request

    def record(request: object, grammar: object = None) -> None:
        seen.append(request)
        original(request, grammar)

    front = real_server.ctx.front
    encode = front.encode
    encoded: list[tuple[str, threading.Thread]] = []

    def encode_on(segments: Sequence[str], add_special_tokens: bool = True) -> object:
        encoded.append(("".join(segments), threading.current_thread()))
        return encode(segments, add_special_tokens)

    monkeypatch.setattr(engine_core, "add_request", record)
    monkeypatch.setattr(front, "encode", encode_on)
    client, ws = await session(real_server)
    await client.ask(map_reduce(2))
    assert "text" in (await client.values(1))["final"]
    monkeypatch.undo()
    assert len(seen) == 3 and len(encoded) == 3
    assert {thread for _, thread in encoded} == {threading.current_thread()}  # never the step's
    tokenizer = engine_core.tokenizer
    for request, (text, _) in zip(seen, encoded, strict=True):
        assert list(request.prompt_token_ids) == tokenizer.encode(text)  # type: ignore[attr-defined]
        assert request.prompt_token_ids[0] == tokenizer.bos_token_id  # type: ignore[attr-defined]
    await ws.close()


async def test_a_prefix_cache_reset_makes_the_next_request_compute_its_prompt(
    real_engine: object,
) -> None:
    """``POST /reset_prefix_cache`` (vLLM's dev-mode endpoint, behind --dev-endpoints): the
    same prompt again is served from the cache before the reset and computed after it;
    without the flag the endpoint is not there."""
    import httpx

    from eclectus.server.config import ServerConfig
    from eclectus.server.front.app import start_server

    prompt = "A ledger of the harbour's ships, their cargo and their ports of call. " * 12
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}

    async def cached(http: httpx.AsyncClient, url: str) -> int:
        answer = await http.post(f"{url}/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    dev = ServerConfig(port=0, dev_endpoints=True)
    server = await start_server(dev, real_engine, owns_backend=False)  # type: ignore[arg-type]
    closed = await start_server(ServerConfig(port=0), real_engine, owns_backend=False)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            await cached(http, server.http_url)
            assert await cached(http, server.http_url) > 100  # warm: the prompt's blocks hit
            reset = await http.post(f"{server.http_url}/reset_prefix_cache")
            assert reset.status_code == 200
            assert await cached(http, server.http_url) == 0
            refused = await http.post(f"{closed.http_url}/reset_prefix_cache")
            assert refused.status_code == 404 and "--dev-endpoints" in refused.text
    finally:
        await server.close()
        await closed.close()
