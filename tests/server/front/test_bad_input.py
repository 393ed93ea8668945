"""Each bad input gets an error frame naming what was wrong, and the session keeps working."""

from __future__ import annotations

import json

import pytest
from scripted_engine import FRONT, ScriptedEngine
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from ws_helpers import RawClient, ServerFactory, map_reduce

from eclectus.server.front.app import EclectusServer

ABC = FRONT.tokenizer.encode("abc", add_special_tokens=False)


async def still_works(client: RawClient) -> None:
    reply = await client.ask({"type": "tokenize", "id": "t", "text": "abc"})
    assert reply == {"type": "tokens", "id": "t", "count": len(ABC), "ids": ABC}


async def expect_error(client: RawClient, frame: object, code: str) -> dict:
    reply = await client.ask(frame if isinstance(frame, str) else json.dumps(frame))
    assert reply["type"] == "error" and reply["code"] == code, reply
    await still_works(client)
    return reply


async def test_non_json_frame(client: RawClient) -> None:
    reply = await expect_error(client, "{not json", "bad_request")
    assert "not JSON" in reply["message"]


async def test_binary_frame(client: RawClient) -> None:
    await client.ws.send(b"\x00\x01")
    assert (await client.recv())["code"] == "bad_request"
    await still_works(client)


async def test_unknown_frame_type(client: RawClient) -> None:
    reply = await expect_error(client, {"type": "launch", "id": "x"}, "unknown_type")
    assert reply["field"] == "type" and reply["id"] == "x"


async def test_field_of_wrong_type(client: RawClient) -> None:
    reply = await expect_error(client, {"type": "get", "var": 5}, "bad_request")
    assert reply["field"] == "var"


async def test_nested_field_of_wrong_type_is_located(client: RawClient) -> None:
    frame = map_reduce(2)
    frame["calls"][1]["sampling"]["summary"]["max_tokens"] = "many"
    reply = await expect_error(client, frame, "bad_request")
    assert reply["field"] == "calls[1].sampling.summary.max_tokens"


async def test_unknown_variable(client: RawClient) -> None:
    reply = await expect_error(client, {"type": "get", "var": "ghost"}, "unknown_var")
    assert reply["var"] == "ghost"


async def test_two_producers(client: RawClient) -> None:
    frame = map_reduce(2)
    frame["calls"][1]["bind"]["summary"] = "sum0"
    reply = await expect_error(client, frame, "duplicate_producer")
    assert reply["var"] == "sum0"


async def test_cycle(client: RawClient) -> None:
    calls = [
        {"id": "a", "segments": [{"var": "y"}, {"gen": "x"}]},
        {"id": "b", "segments": [{"var": "x"}, {"gen": "y"}]},
    ]
    await expect_error(client, {"type": "submit", "calls": calls}, "cycle")


@pytest.mark.parametrize("template", ["Hi {{name", "{{a}} {{a}} {{o}}", "x }} {{o}}"])
async def test_bad_templates(client: RawClient, template: str) -> None:
    call = {
        "id": "c",
        "template": template,
        "bind": {"a": "k", "o": "o", "name": "k"},
        "sampling": {"o": {}},
    }
    frame = {"type": "submit", "vars": [{"id": "k", "value": "v"}], "calls": [call]}
    reply = await expect_error(client, frame, "bad_template")
    assert reply["field"] == "calls[0].template"


async def test_rejected_fragment_adds_nothing(client: RawClient) -> None:
    frame = map_reduce(2)
    frame["calls"][0]["bind"]["doc"] = "missing"
    await expect_error(client, frame, "unknown_var")
    await expect_error(client, {"type": "get", "var": "doc1"}, "unknown_var")
    assert (await client.ask(map_reduce(2)))["type"] == "ack"  # same ids are still free


async def test_frame_over_limit(make_server: ServerFactory) -> None:
    server = await make_server(max_frame_bytes=1000)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        huge = {"type": "tokenize", "text": "x" * 2000}
        reply = await expect_error(client, huge, "limit_exceeded")
        assert "1000" in reply["message"]


async def test_prompt_and_graph_over_limits(make_server: ServerFactory) -> None:
    server = await make_server(max_prompt_tokens=30, max_calls_per_session=3)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await expect_error(client, map_reduce(4), "limit_exceeded")  # 6 calls and ops
        frame = map_reduce(1)
        frame["vars"][0]["value"] = "x" * 100
        reply = await expect_error(client, frame, "limit_exceeded")
        assert reply["field"] == "calls[0]"


async def test_prompt_over_limit_after_generation_fails_the_var(make_server: ServerFactory) -> None:
    """A prompt that only grows too long once inputs are generated fails at dispatch."""
    server = await make_server(max_prompt_tokens=24)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        frame = map_reduce(5)  # each map prompt fits (13 tokens); 5 summaries (39) do not
        frame["calls"][-1]["template"] = "C{{all}}{{final}}"
        frame["calls"][-1]["sampling"]["final"]["max_tokens"] = 4
        assert (await client.ask(frame))["type"] == "ack"
        answer = (await client.values(1))["final"]
        assert answer["code"] == "limit_exceeded" and answer["var"] == "final"


async def test_engine_error_reaches_the_get_with_the_var(make_server: ServerFactory) -> None:
    engine = ScriptedEngine(fail_if=lambda r: "/map0/" in r.request_id)
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        frame = map_reduce(2)
        frame["gets"].append({"var": "sum1"})
        await client.ask(frame)
        answers = await client.values(2)
        assert answers["final"]["code"] == "engine_error"
        assert answers["sum1"]["type"] == "value"
        await still_works(client)


async def test_handler_exception_answers_internal(
    client: RawClient, engine: ScriptedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> list[int]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(FRONT, "encode", broken)
    reply = await client.ask({"type": "tokenize", "text": "x"})
    assert reply["code"] == "internal"
    monkeypatch.undo()
    await still_works(client)


async def test_frames_before_hello(server: EclectusServer) -> None:
    async with connect(server.url) as ws:
        client = RawClient(ws)
        reply = await client.ask({"type": "get", "var": "x"})
        assert reply["code"] == "bad_request" and reply["field"] == "type"
        await client.hello()
        await still_works(client)


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_bad_or_missing_token_closes(make_server: ServerFactory, token: str | None) -> None:
    server = await make_server(token="s3cret")
    async with connect(server.url) as ws:
        client = RawClient(ws)
        reply = await client.ask({"type": "hello", "token": token})
        assert (reply["code"], reply["field"]) == ("unauthorized", "token")
        with pytest.raises(ConnectionClosed):
            await client.recv()
        assert ws.close_code == 1008
    assert server.metrics.sessions == 0


async def test_unknown_field_is_named(client: RawClient) -> None:
    reply = await expect_error(client, {"type": "get", "var": "x", "colour": "red"}, "bad_request")
    assert reply["field"] == "colour"


async def test_frame_far_over_limit_closes_only_that_socket(make_server: ServerFactory) -> None:
    """Beyond 4x max_frame_bytes websockets refuses to read the frame (close 1009); the
    server and other sessions carry on."""
    server = await make_server(max_frame_bytes=1000)
    async with connect(server.url) as ws_ok, connect(server.url) as ws_big:
        ok, big = RawClient(ws_ok), RawClient(ws_big)
        await ok.hello()
        await big.hello()
        await big.send({"type": "tokenize", "text": "x" * 5000})
        with pytest.raises(ConnectionClosed):
            await big.recv()
        assert ws_big.close_code == 1009
        await still_works(ok)


@pytest.mark.parametrize("first", [{"type": "get", "var": "x"}, "not json"])
async def test_auth_on_anything_but_hello_first_closes(
    make_server: ServerFactory, first: object
) -> None:
    server = await make_server(token="s3cret")
    async with connect(server.url) as ws:
        client = RawClient(ws)
        reply = await client.ask(first if isinstance(first, str) else json.dumps(first))
        assert reply["type"] == "error"
        with pytest.raises(ConnectionClosed):
            await client.recv()
        assert ws.close_code == 1008
