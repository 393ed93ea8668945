"""No client can hurt another through its session: malformed frames are plain bad_requests
(no traceback in the log), waiting gets are capped, a slow reader is disconnected, a big
submit counts its tokens off the event loop, and the one prompt limit is limit_exceeded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import pytest
from scripted_engine import FRONT, ScriptedEngine
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.benchmarks.loadtest import deaf_client, send_frame
from eclectus.server.front.prompt import Front, Prompt


async def still_works(client: RawClient) -> None:
    reply = await client.ask({"type": "tokenize", "id": "t", "text": "abc"})
    assert reply["type"] == "tokens", reply


async def ask_raw(client: RawClient, text: str) -> dict:
    await client.ws.send(text)
    return await client.recv()


def no_log_above_info(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.levelno > logging.INFO]
    assert not loud, [r.getMessage() for r in loud]


async def test_a_lone_surrogate_frame_id_gets_an_error_frame(
    client: RawClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The id cannot be echoed (it is no UTF-8): the error frame goes without it."""
    reply = await ask_raw(client, '{"type": "get", "id": "\\ud800", "var": "x"}')
    assert reply["code"] == "bad_request" and "surrogate" in reply["message"], reply
    assert "id" not in reply
    await still_works(client)
    no_log_above_info(caplog)


async def test_lone_surrogates_in_text_are_bad_requests(
    client: RawClient, caplog: pytest.LogCaptureFixture
) -> None:
    for text in ("\\udfff", "a\\ud83d", "\\ud83d\\ud83d\\ude00x\\udc00"):
        frame = '{"type": "submit", "id": "s", "vars": [{"id": "v", "value": "' + text + '"}]}'
        reply = await ask_raw(client, frame)
        assert (reply["code"], reply["id"]) == ("bad_request", "s"), reply
    paired = '{"type": "submit", "id": "ok", "vars": [{"id": "v", "value": "\\ud83d\\ude00"}]}'
    assert (await ask_raw(client, paired))["type"] == "ack"  # a proper pair is an emoji
    await still_works(client)
    no_log_above_info(caplog)


@pytest.mark.parametrize("depth", [100_000, 900])
async def test_deeply_nested_json_is_a_bad_request(
    client: RawClient, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    frame = '{"type": "submit", "id": "d", "vars": ' + "[" * depth + "]" * depth + "}"
    reply = await ask_raw(client, frame)
    assert reply["code"] == "bad_request", reply
    await still_works(client)
    no_log_above_info(caplog)


async def test_pending_gets_per_session_are_capped(make_server: ServerFactory) -> None:
    server = await make_server(max_pending_gets_per_session=4)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.ask({"type": "submit", "id": "s", "vars": [{"id": "v"}]})
        for i in range(4):
            await client.send({"type": "get", "id": f"g{i}", "var": "v", "stream": True})
        reply = await client.ask({"type": "get", "id": "g4", "var": "v"})
        assert (reply["code"], reply["var"]) == ("limit_exceeded", "v"), reply
        await client.send({"type": "set", "id": "set", "var": "v", "value": "hi"})
        seen = [await client.recv() for _ in range(5)]
        assert sorted(f["type"] for f in seen) == ["ack"] + ["value"] * 4
        # answered gets free their places; gets on a final variable never take one
        for i in range(10):
            assert (await client.ask({"type": "get", "id": f"r{i}", "var": "v"}))["type"] == "value"
        await client.send({"type": "submit", "id": "s2", "vars": [{"id": "w"}]})
        await client.recv()
        for i in range(4):
            await client.send({"type": "get", "id": f"w{i}", "var": "w"})
        assert (await client.ask({"type": "get", "id": "w4", "var": "w"}))["type"] == "error"


async def test_a_reader_that_falls_behind_is_disconnected(make_server: ServerFactory) -> None:
    """A client that reads nothing of the 40 MB it asked for is dropped once 1 MB of frames
    wait in its outbox (the 1008 close frame cannot pass its full socket, so the connection
    goes after the close timeout); another session on the same server is not slowed."""
    slow_server = await make_server(max_outbox_bytes=1 << 20, close_timeout_s=0.5)
    reader, writer, protocol = await deaf_client(slow_server.url)
    async with connect(slow_server.url) as ws2:
        other = RawClient(ws2)
        await other.hello()
        send_frame(writer, protocol, {"type": "hello"})
        value = {"id": "v", "value": "x" * 500_000}
        send_frame(writer, protocol, {"type": "submit", "id": "s", "vars": [value]})
        for i in range(80):
            send_frame(writer, protocol, {"type": "get", "id": f"g{i}", "var": "v"})
        await writer.drain()
        start = time.perf_counter()
        await still_works(other)
        assert time.perf_counter() - start < 0.5
        async with asyncio.timeout(10):  # the server hangs up: the stream ends (or resets)
            await asyncio.sleep(1.0)
            with contextlib.suppress(ConnectionError):
                while await reader.read(1 << 20):
                    pass
        writer.close()
        assert len(slow_server.ctx.sessions) == 1
        await still_works(other)


class SlowFront(Front):
    """A front whose tokenizer costs 4 ms a prompt (off the GIL, like a native one); a token
    is a word, and BOS one more."""

    def encode(self, segments: Sequence[str], add_special_tokens: bool = True) -> Prompt:
        time.sleep(0.004)
        ids = (0,) * add_special_tokens + (1,) * len("".join(segments).split())
        return Prompt(ids, (len(ids),) * len(segments))


SLOW_FRONT = SlowFront("tiny", FRONT.tokenizer)


async def test_a_big_submit_does_not_stall_other_sessions(make_server: ServerFactory) -> None:
    """500 calls whose known text must be tokenized (2 s of tokenizer): another session's
    round trips stay fast meanwhile (they waited the whole 2 s before). What remains on the
    loop is parsing and staging the 1 MB frame, ~50 ms on a quiet 2-core machine: the bound
    leaves room for a loaded one."""
    server = await make_server(front=SLOW_FRONT, max_prompt_tokens=1000)
    calls = [
        {"id": f"c{i}", "segments": [{"text": f"call {i}: " + "word " * 400}, {"gen": f"o{i}"}]}
        for i in range(500)
    ]
    async with connect(server.url) as ws, connect(server.url) as ws2:
        big, other = RawClient(ws), RawClient(ws2)
        await big.hello()
        await other.hello()
        await big.send({"type": "submit", "id": "big", "calls": calls})
        submitted = asyncio.create_task(big.recv(timeout=30))
        worst = 0.0
        while not submitted.done():
            start = time.perf_counter()
            await still_works(other)
            worst = max(worst, time.perf_counter() - start)
            await asyncio.sleep(0.01)
        assert (await submitted)["type"] == "ack"
        assert worst < 0.4, worst


async def test_a_big_known_prompt_is_still_refused_at_submit(make_server: ServerFactory) -> None:
    server = await make_server(front=SLOW_FRONT, max_prompt_tokens=100)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        frame = {
            "type": "submit",
            "id": "s",
            "vars": [{"id": "doc", "value": "word " * 60}],
            "calls": [
                {"id": "ok", "segments": [{"var": "doc"}, {"gen": "a"}]},
                {"id": "big", "segments": [{"var": "doc"}, {"var": "doc"}, {"gen": "b"}]},
            ],
        }
        reply = await client.ask(frame)
        assert (reply["code"], reply["field"]) == ("limit_exceeded", "calls[1]"), reply
        assert "121 tokens, limit 100" in reply["message"]


async def test_the_prompt_limit_leaves_room_for_one_output_token(
    make_server: ServerFactory,
) -> None:
    """The window is 4096: welcome says 4095, and a prompt of exactly 4096 tokens is refused
    at submit as limit_exceeded (it was accepted and failed later as engine_error)."""
    server = await make_server(front=SLOW_FRONT)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        welcome = await client.hello()
        assert welcome["limits"]["max_prompt_tokens"] == 4095
        # SlowFront: a token per word, plus BOS
        frame = {
            "type": "submit",
            "id": "s",
            "calls": [{"id": "c", "segments": [{"text": "w " * 4095}, {"gen": "o"}]}],
        }
        reply = await client.ask(frame)
        assert reply["code"] == "limit_exceeded", reply
        frame["calls"][0]["segments"][0]["text"] = "w " * 4094
        frame["gets"] = [{"var": "o"}]
        assert (await client.ask(frame))["type"] == "ack"
        assert (await client.recv())["type"] == "value"


@pytest.mark.slow
async def test_a_prompt_over_the_kv_pool_is_limit_exceeded_on_the_real_engine() -> None:
    """A pool of 8 blocks (128 tokens), smaller than tiny's window: welcome says so, and a
    prompt the pool cannot hold is limit_exceeded (it came back as an empty 'length' value)."""
    from eclectus.server.config import ServerConfig
    from eclectus.server.engine import AsyncEngine
    from eclectus.server.front.app import start_server

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=8)
    server = await start_server(ServerConfig(port=0), engine, owns_backend=True)
    try:
        async with connect(server.url) as ws:
            client = RawClient(ws)
            welcome = await client.hello()
            assert welcome["models"][0]["context_window"] == 128
            assert welcome["limits"]["max_prompt_tokens"] == 127
            frame = {
                "type": "submit",
                "id": "s",
                "vars": [{"id": "doc", "value": "many words " * 100}],
                "calls": [{"id": "c", "segments": [{"var": "doc"}, {"gen": "o"}]}],
                "gets": [{"var": "o"}],
            }
            reply = await client.ask(frame)
            assert reply["code"] == "limit_exceeded", reply
            # known only at dispatch: the input is set after the submit
            frame["vars"] = [{"id": "later"}]
            frame["calls"][0]["segments"][0] = {"var": "later"}
            assert (await client.ask(frame))["type"] == "ack"
            await client.ask({"type": "set", "id": "x", "var": "later", "value": "w " * 200})
            answer = (await client.values(1))["o"]
            assert answer["code"] == "limit_exceeded", answer
    finally:
        await server.close()


async def test_a_repeated_handler_bug_logs_one_traceback(
    client: RawClient,
    engine: ScriptedEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that found a bug may trigger it 50 times: one traceback, one line each."""

    def broken(*args: object) -> list[int]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(FRONT, "encode", broken)
    for i in range(50):
        reply = await client.ask({"type": "tokenize", "id": f"t{i}", "text": "x"})
        assert reply["code"] == "internal"
    records = [r for r in caplog.records if r.name == "eclectus.server.front.session"]
    assert len(records) == 50
    assert sum(bool(r.exc_info) for r in records) == 1
