"""Which calls the engine may stream coarsely (``EngineRequest.stream_interval``): the
scheduler decides at dispatch from who watches a call's tokens; the /v1 endpoint honours a
client's ``stream_interval`` as vLLM does. Real server, real sockets, the scripted engine
(three outputs per request; one token per byte)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripted_engine import ScriptedEngine, scripted_text
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.server.backend import EngineOutput
from eclectus.server.config import ServerConfig
from eclectus.server.front.openai_api import _Job

Frame = dict[str, Any]


def two_calls(stream_a0: bool) -> Frame:
    """Two independent calls, both got; only ``a0``'s get streams when ``stream_a0``."""
    frame: Frame = {"type": "submit", "vars": [], "calls": [], "gets": []}
    for i in range(2):
        frame["calls"].append(
            {
                "id": f"c{i}",
                "template": f"Q{i}:{{{{a{i}}}}}",
                "bind": {f"a{i}": f"a{i}"},
                "sampling": {f"a{i}": {"max_tokens": 16}},
            }
        )
    frame["gets"] = [{"var": "a0", "stream": stream_a0}, {"var": "a1"}]
    return frame


def intervals(engine: ScriptedEngine) -> dict[str, int]:
    """Each engine request's stream interval, by output variable (pure)."""
    return {f"a{r.request_id.split('/')[1][1:]}": r.stream_interval for r in engine.requests}


async def test_a_streamed_get_streams_every_token_and_an_unwatched_call_is_coarse(
    make_server: ServerFactory,
) -> None:
    """The call a streaming get watches goes out with interval 1, the other with the
    server's ``engine_stream_interval`` (16 by default)."""
    engine = ScriptedEngine()
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.send(two_calls(stream_a0=True))
        answers = await client.values(2)
    assert all(a["type"] == "value" for a in answers.values())
    assert intervals(engine) == {"a0": 1, "a1": 16}


async def test_the_interval_comes_from_the_config(make_server: ServerFactory) -> None:
    """``engine_stream_interval`` 1 turns coarse streams off; 4 is passed as it is."""
    for configured in (1, 4):
        engine = ScriptedEngine()
        server = await make_server(engine, engine_stream_interval=configured)
        async with connect(server.url) as ws:
            client = RawClient(ws)
            await client.hello()
            await client.send(two_calls(stream_a0=False))
            await client.values(2)
        assert intervals(engine) == {"a0": configured, "a1": configured}


async def test_a_streamer_that_attaches_after_dispatch_gets_every_piece(
    make_server: ServerFactory,
) -> None:
    """A streaming get that arrives once the call is in the engine (dispatched coarse)
    still receives the whole text as deltas, then the value."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.send(two_calls(stream_a0=False))
        while len(engine.requests) < 2:
            await asyncio.sleep(0.01)
        await client.send({"type": "get", "var": "a0", "stream": True})
        engine.release()
        deltas: list[str] = []
        values: dict[str, str] = {}
        while len(values) < 3:  # a0 answered twice (both gets), a1 once
            frame = await client.recv()
            if frame["type"] == "delta":
                deltas.append(frame["text"])
            elif frame["type"] == "value":
                values[f"{frame['var']}{len(values)}"] = frame["text"]
    assert intervals(engine)["a0"] == 16
    assert deltas and "".join(deltas) == scripted_text("Q0:", 16)


async def openai_stream(url: str, body: Frame) -> list[Frame]:
    """The SSE payloads of a streamed /v1/completions request, [DONE] left out."""
    events: list[Frame] = []
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", f"{url}/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    return events


async def test_openai_stream_interval_coalesces_chunks(make_server: ServerFactory) -> None:
    """``stream_interval`` 4 on /v1/completions: the first output at once, the rest held
    until 4 tokens or the end; the text and ids are all there; the engine is asked for the
    same interval. Without it every output is its own chunk, and a non-streamed request's
    call counts as unwatched."""
    engine = ScriptedEngine()
    server = await make_server(engine)
    body = {"prompt": "Say:", "max_tokens": 10, "stream": True, "return_token_ids": True}
    text = scripted_text("Say:", 10)  # three outputs: 3, 3 and 4 bytes
    each = await openai_stream(server.openai_url, body)
    coarse = await openai_stream(server.openai_url, body | {"stream_interval": 4})
    async with httpx.AsyncClient() as http:
        whole = await http.post(f"{server.openai_url}/completions", json=body | {"stream": False})
    assert whole.json()["choices"][0]["text"] == text
    for events in (each, coarse):
        texts = [e["choices"][0]["text"] for e in events]
        assert "".join(texts) == text
        assert sum(len(e["choices"][0]["token_ids"]) for e in events) == len(text.encode())
    pieces = [len(e["choices"][0]["token_ids"]) for e in coarse if e["choices"][0]["text"]]
    assert pieces == [3, 7]  # the first at once; 3 held (< 4), sent with the final 4
    assert len([e for e in each if e["choices"][0]["text"]]) == 3
    assert [r.stream_interval for r in engine.requests] == [1, 4, 16]


@pytest.mark.parametrize("value", [0, -2, "often", 1.5])
async def test_a_bad_stream_interval_is_a_400_naming_it(
    make_server: ServerFactory, value: object
) -> None:
    server = await make_server(ScriptedEngine())
    body = {"prompt": "Say:", "stream": True, "stream_interval": value}
    async with httpx.AsyncClient() as http:
        for route in ("completions", "chat/completions"):
            payload = body if route == "completions" else body | {"messages": [{"role": "user"}]}
            response = await http.post(f"{server.openai_url}/{route}", json=payload)
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["param"] == "stream_interval" and "stream_interval" in error["message"]


def test_the_config_refuses_an_interval_below_1() -> None:
    with pytest.raises(ValueError, match="engine_stream_interval must be >= 1"):
        ServerConfig(engine_stream_interval=0)


outputs = st.lists(
    st.tuples(st.text(max_size=3), st.lists(st.integers(0, 255), max_size=5)), max_size=30
)


@given(outputs, st.integers(1, 20))
def test_coalesced_chunks_hold_every_output_in_order(
    parts: list[tuple[str, list[int]]], interval: int
) -> None:
    """For any engine outputs: the queued chunks concatenate to the outputs' text and ids;
    the first non-empty output is queued alone; every later chunk but the last has at least
    ``interval`` ids; nothing is held once the final output is in."""
    job = _Job(None, ["out0"], streaming=True, interval=interval)  # type: ignore[arg-type]
    news = [EngineOutput("r", text, tuple(ids)) for text, ids in parts]
    news.append(EngineOutput("r", "", (), finished=True, finish_reason="stop"))
    for output in news:
        job.on_output("out0", output)
    chunks: list[Any] = [job.chunks.get_nowait() for _ in range(job.chunks.qsize())]
    assert "".join(c[1] for c in chunks) == "".join(t for t, _ in parts)
    assert [i for c in chunks for i in c[2]] == [i for _, ids in parts for i in ids]
    first = next(((t, tuple(i)) for t, i in parts if t or i), None)
    assert (chunks[0][1:] if chunks else None) == first
    assert all(len(c[2]) >= interval for c in chunks[1:-1])
    assert job.held == ("", ())
