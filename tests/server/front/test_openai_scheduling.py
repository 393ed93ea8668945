"""/v1 requests are ordinary graphs in the scheduler: the same caps and fairness as the
WebSocket protocol, a bounded number of prompts, and a client that leaves aborts its work."""

from __future__ import annotations

import asyncio
import json

import httpx
from scripted_engine import ScriptedEngine, prompt_text, scripted_text
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory, map_reduce

from eclectus.server.front.app import EclectusServer


async def wait_for(condition: object, timeout: float = 5.0) -> None:
    """Poll ``condition()`` until it is true (the server runs on this loop)."""
    for _ in range(int(timeout / 0.01)):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def post(server: EclectusServer, body: dict, path: str = "completions") -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{server.openai_url}/{path}", json=body)


async def raw_post(
    server: EclectusServer, body: dict
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a POST on a raw socket and leave it open (the test closes it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    return reader, writer


async def test_openai_requests_obey_max_inflight(make_server: ServerFactory) -> None:
    """A list prompt's calls queue in the scheduler: at most max_inflight reach the engine,
    and the rest follow as slots free; the answers come back in prompt order."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine, max_inflight=2)
    prompts = [f"prompt {i}" for i in range(5)]
    pending = asyncio.ensure_future(post(server, {"prompt": prompts, "max_tokens": 4}))
    await wait_for(lambda: len(engine.requests) == 2)
    await asyncio.sleep(0.05)
    assert len(engine.requests) == 2 and server.scheduler.num_inflight == 2
    assert len(server.scheduler.queue) == 3
    engine.release()
    answer = (await pending).json()
    assert [c["text"] for c in answer["choices"]] == [scripted_text(p, 4) for p in prompts]
    assert server.scheduler.snapshot() == []


async def test_openai_work_queues_behind_an_older_websocket_app(
    make_server: ServerFactory,
) -> None:
    """One engine slot, taken by one of a WebSocket app's maps (a group obeys admission
    like any call: its other two wait): a later /v1 request waits in the scheduler's queue
    behind them, instead of going straight to the engine."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine, max_inflight=1)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.ask(map_reduce(3))
        await wait_for(lambda: len(engine.requests) == 1)  # one map: one slot
        pending = asyncio.ensure_future(post(server, {"prompt": "late", "max_tokens": 2}))
        await wait_for(lambda: len(server.scheduler.queue) == 3)
        await asyncio.sleep(0.05)
        assert len(engine.requests) == 1  # the other maps and the /v1 call wait here
        engine.release()
        assert (await pending).status_code == 200
        await client.values(1)
    order = ["late" if prompt_text(r) == "late" else "ws" for r in engine.requests]
    assert order[:3] == ["ws", "ws", "ws"] and sorted(order[3:]) == ["late", "ws"]


async def test_a_lower_priority_value_queued_behind_the_cap_runs_first(
    make_server: ServerFactory,
) -> None:
    """vLLM's ``priority`` on both endpoints: with the one engine slot taken, a request
    with priority 1 that arrives after one with priority 10 is dispatched before it (and the
    engine is told so too); a priority out of range is a 400 naming the field."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine, max_inflight=1)
    blocker = asyncio.ensure_future(post(server, {"prompt": "first", "max_tokens": 2}))
    await wait_for(lambda: len(engine.requests) == 1)
    late = {"prompt": "ten", "max_tokens": 2, "priority": 10}
    high = asyncio.ensure_future(post(server, late))
    await wait_for(lambda: len(server.scheduler.queue) == 1)
    chat = {"messages": [{"role": "user", "content": "one"}], "max_tokens": 2, "priority": 1}
    low = asyncio.ensure_future(post(server, chat, path="chat/completions"))
    await wait_for(lambda: len(server.scheduler.queue) == 2)
    engine.release()
    answers = await asyncio.gather(blocker, high, low)
    assert [a.status_code for a in answers] == [200, 200, 200]
    first, one, ten = engine.requests
    assert prompt_text(first) == "first" and "one" in prompt_text(one) and prompt_text(ten) == "ten"
    assert one.priority < ten.priority
    refused = await post(server, {"prompt": "x", "priority": 2**63})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"


async def test_prompts_per_request_are_capped(make_server: ServerFactory) -> None:
    """A list of more than max_prompts_per_request prompts is a 400 naming the limit;
    nothing reaches the engine."""
    engine = ScriptedEngine()
    server = await make_server(engine, max_prompts_per_request=8)
    answer = await post(server, {"prompt": ["x"] * 20_000, "max_tokens": 1})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "prompt"
    assert "20000 prompts, limit 8" in answer.json()["error"]["message"]
    assert engine.requests == []


async def test_a_client_that_leaves_aborts_its_request(make_server: ServerFactory) -> None:
    """Non-streaming and streaming alike: the client closes its socket while its requests
    are in the engine; they are aborted and the app is gone."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine)
    for stream in (False, True):
        engine.requests.clear()
        body = {"prompt": "long work", "max_tokens": 4, "stream": stream}
        _, writer = await raw_post(server, body)
        await wait_for(lambda: len(engine.running) == 1)
        request_id = engine.requests[0].request_id
        writer.close()
        await wait_for(lambda rid=request_id: rid in engine.aborted)
        await wait_for(lambda: engine.running == set() and server.scheduler.snapshot() == [])
        assert server.scheduler.num_inflight == 0


async def test_engine_failure_is_a_500_in_openai_shape(make_server: ServerFactory) -> None:
    engine = ScriptedEngine(fail_if=lambda r: True)
    server = await make_server(engine)
    answer = await post(server, {"prompt": "x", "max_tokens": 2})
    assert answer.status_code == 500
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "server_error"
    assert "injected failure" in error["message"]


async def test_unknown_route_and_model_are_404s(make_server: ServerFactory) -> None:
    server = await make_server()
    answer = await post(server, {"prompt": "x", "model": "nope"})
    assert (answer.status_code, answer.json()["error"]["code"]) == (404, "model_not_found")
    answer = await post(server, {}, path="embeddings")
    assert answer.status_code == 404 and "no route" in answer.json()["error"]["message"]


async def test_max_tokens_defaults_follow_openai(make_server: ServerFactory) -> None:
    """Without max_tokens, /v1/completions generates 16 tokens at most (OpenAI's documented
    default) and /v1/chat/completions until EOS or the context window (None), as vLLM does."""
    engine = ScriptedEngine()
    server = await make_server(engine)
    done = await post(server, {"model": "tiny", "prompt": "hi"})
    assert done.status_code == 200, done.text
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    done = await post(server, chat, "chat/completions")
    assert done.status_code == 200, done.text
    assert [r.sampling.max_tokens for r in engine.requests] == [16, None]
