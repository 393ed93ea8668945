"""Sessions over a real socket: auth, isolation, streaming, clean-up, observability."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

import pytest
from scripted_engine import ScriptedEngine, scripted_text
from websockets.asyncio.client import connect
from websockets.sync.client import connect as sync_connect
from ws_helpers import RawClient, ServerFactory, map_reduce

from eclectus.adapters.client import connect as connect_sdk
from eclectus.adapters.client.connect import MAX_HELLO_HEADER_CHARS
from eclectus.protocol import HELLO_ACCEPTED, HELLO_HEADER
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread
from eclectus.server.front.metrics import parse_prometheus


def http_get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


async def fetch(url: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(http_get, url)


async def test_auth_on_accepts_the_right_token(make_server: ServerFactory) -> None:
    server = await make_server(token="s3cret")
    async with connect(server.url) as ws:
        welcome = await RawClient(ws).hello(token="s3cret", app="t")
        assert welcome["models"][0]["name"] == "tiny"
        assert welcome["limits"]["max_frame_bytes"] == server.ctx.config.max_frame_bytes


async def test_the_welcome_announces_every_configured_limit(make_server: ServerFactory) -> None:
    limits = {
        "max_frame_bytes": 1 << 20,
        "max_prompt_tokens": 101,
        "max_vars_per_session": 102,
        "max_calls_per_session": 103,
        "max_pending_gets_per_session": 104,
        "max_map_items": 105,
        "max_map_element_bytes": 106,
    }
    server = await make_server(**limits)
    async with connect(server.url) as ws:
        assert (await RawClient(ws).hello(app="t"))["limits"] == limits


async def test_a_hello_in_the_upgrade_request_is_answered_after_the_upgrade(
    make_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """With the hello header the server says it took it and sends the welcome unasked; the
    session then serves as usual. Non-ASCII travels escaped."""
    caplog.set_level(logging.INFO, logger="eclectus.server.front.session")
    server = await make_server(token="s3cret")
    hello = json.dumps({"type": "hello", "protocol": 1, "token": "s3cret", "app": "résumé ✓"})
    async with connect(server.url, additional_headers={HELLO_HEADER: hello}) as ws:
        assert ws.response is not None
        assert ws.response.headers[HELLO_HEADER] == HELLO_ACCEPTED
        client = RawClient(ws)
        welcome = await client.recv()
        assert welcome["type"] == "welcome", welcome
        assert "(app 'résumé ✓'" in caplog.text
        await client.ask(map_reduce(1))
        assert (await client.values(1))["final"]["type"] == "value"
        again = await client.ask({"type": "hello", "token": "s3cret"})
        assert (again["code"], again["field"]) == ("bad_request", "type")


async def test_a_refused_hello_header_closes_like_a_refused_hello_frame(
    make_server: ServerFactory,
) -> None:
    """A wrong token in the header: ``unauthorized`` naming the token, then close 1008; a
    header that is not a hello frame: ``bad_request``, and the socket waits for a hello."""
    server = await make_server(token="s3cret")
    wrong = json.dumps({"type": "hello", "protocol": 1, "token": "nope"})
    async with connect(server.url, additional_headers={HELLO_HEADER: wrong}) as ws:
        refused = await RawClient(ws).recv()
        assert (refused["code"], refused["field"]) == ("unauthorized", "token")
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.close_code == 1008
    open_server = await make_server()
    async with connect(open_server.url, additional_headers={HELLO_HEADER: "{not json"}) as ws:
        client = RawClient(ws)
        assert (await client.recv())["code"] == "bad_request"
        await client.hello()


async def test_the_sdk_sends_a_hello_too_long_for_a_header_as_a_frame(
    make_server: ServerFactory,
) -> None:
    """A 20 KB token would make the upgrade's head longer than the server takes (h11: 16
    KiB; sent as a header it fails the handshake): the SDK sends that hello as a frame, and
    the session opens either way."""
    for token in ("s3cret", "t" * 5 * MAX_HELLO_HEADER_CHARS):
        server = await make_server(token=token)
        before = server.ctx.metrics.client_frames
        async with connect_sdk(server.url, token=token) as app:
            assert app.session_id
        # header: the hello (from the header) and close; frame: the same two frames
        assert server.ctx.metrics.client_frames - before == 2


async def test_sessions_cannot_see_each_others_variables(server: EclectusServer) -> None:
    async with connect(server.url) as ws_a, connect(server.url) as ws_b:
        a, b = RawClient(ws_a), RawClient(ws_b)
        welcome_a, welcome_b = await a.hello(), await b.hello()
        assert welcome_a["session"] != welcome_b["session"]
        await a.ask({"type": "submit", "vars": [{"id": "secret", "value": "a's text"}]})
        reply = await b.ask({"type": "get", "var": "secret"})
        assert (reply["code"], reply["var"]) == ("unknown_var", "secret")
        # b may use the same id for its own variable
        await b.ask({"type": "submit", "vars": [{"id": "secret", "value": "b's text"}]})
        assert (await b.ask({"type": "get", "var": "secret"}))["text"] == "b's text"
        assert (await a.ask({"type": "get", "var": "secret"}))["text"] == "a's text"


async def test_stream_sends_deltas_then_value(client: RawClient) -> None:
    await client.ask(map_reduce(2) | {"gets": []})
    await client.send({"type": "get", "id": "g", "var": "final", "stream": True})
    deltas = []
    while (frame := await client.recv())["type"] == "delta":
        deltas.append(frame["text"])
    assert frame["type"] == "value" and "".join(deltas) == frame["text"]
    assert len(deltas) == 3 and frame["usage"]["completion_tokens"] == 8


async def test_disconnect_mid_graph_frees_everything(make_server: ServerFactory) -> None:
    """Many sessions leave with work in flight: their requests are aborted, nothing stays
    running, the session count returns to 0, and a live session is not disturbed."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine)
    async with connect(server.url) as ws_live:
        live = RawClient(ws_live)
        await live.hello()
        for _ in range(10):
            async with connect(server.url) as ws:
                client = RawClient(ws)
                await client.hello()
                await client.ask(map_reduce(3))
                await asyncio.sleep(0.01)
        for _ in range(100):
            if server.metrics.sessions == 1:
                break
            await asyncio.sleep(0.01)
        assert server.metrics.sessions == 1
        assert engine.running == set() and server.scheduler.num_inflight == 0
        assert len(engine.aborted) == 30  # 3 maps in flight per session
        assert server.scheduler.ready == [] and len(server.scheduler.snapshot()) == 1
        engine.release()
        await live.ask(map_reduce(2))
        assert (await live.values(1))["final"]["type"] == "value"


async def test_cancel_frame_fails_downstream(make_server: ServerFactory) -> None:
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.ask(map_reduce(2))
        await client.send({"type": "cancel", "id": "c", "var": "sum0"})
        frames = [await client.recv(), await client.recv()]
        assert {"type": "ack", "id": "c"} in frames
        failed = next(f for f in frames if f["type"] == "error")
        assert (failed["code"], failed["var"]) == ("cancelled", "final")
        engine.release()


async def test_healthz_and_metrics(client: RawClient, server: EclectusServer) -> None:
    """A DAG resolves with one value sent; the counters say what the server saw."""
    status, kind, body = await fetch(server.http_url + "/healthz")
    assert status == 200 and kind == "application/json"
    assert json.loads(body) == {"status": "ok", "model": "tiny", "sessions": 1}
    await client.ask(map_reduce(4))
    await client.values(1)
    status, kind, body = await fetch(server.http_url + "/metrics")
    samples = parse_prometheus(body)
    assert status == 200 and kind.startswith("text/plain")
    assert samples["eclectus_values_sent_total"] == 1
    assert samples["eclectus_calls_finished_total"] == 5
    assert samples["eclectus_client_frames_total"] == 2  # hello, submit
    assert samples['eclectus_get_latency_seconds_count{criteria="latency"}'] == 1
    assert samples["eclectus_prefix_cache_hit_tokens_total"] > 0  # maps share "Summarize:\n"


async def test_client_frames_do_not_grow_with_fan_out(make_server: ServerFactory) -> None:
    frames = []
    for fan_out in (2, 16):
        server = await make_server()
        async with connect(server.url) as ws:
            client = RawClient(ws)
            await client.hello()
            await client.ask(map_reduce(fan_out))
            await client.values(1)
        frames.append((server.metrics.client_frames, server.metrics.values_sent))
    assert frames[0] == frames[1] == (2, 1)


async def test_session_limit(make_server: ServerFactory) -> None:
    server = await make_server(max_sessions=1)
    async with connect(server.url) as ws1, connect(server.url) as ws2:
        await RawClient(ws1).hello()
        reply = await RawClient(ws2).ask({"type": "hello"})
        assert reply["code"] == "limit_exceeded"


async def test_close_frame_ends_the_session(client: RawClient, server: EclectusServer) -> None:
    assert (await client.ask({"type": "close", "id": "bye"}))["type"] == "ack"
    await client.ws.wait_closed()
    assert server.metrics.sessions == 0


def test_serve_in_thread_runs_and_closes() -> None:
    engine_box: list[ScriptedEngine] = []

    def factory() -> ScriptedEngine:
        engine_box.append(ScriptedEngine())
        return engine_box[0]

    with serve_in_thread(ServerConfig(port=0), factory) as server:
        assert server.port > 0
        with sync_connect(server.url) as ws:
            ws.send(json.dumps({"type": "hello"}))
            assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
            ws.send(json.dumps(map_reduce(1)))
            frames = [json.loads(ws.recv(timeout=5)) for _ in range(2)]
        assert frames[1]["text"] == scripted_text(
            "Combine:\n" + scripted_text("Summarize:\ndocument number 0\nSummary:", 8) + "\nFinal:",
            8,
        )
    assert engine_box[0].stopped == 1


async def test_one_port_serves_websocket_http_and_openai(make_server: ServerFactory) -> None:
    """The WebSocket protocol (any path), /healthz, /metrics and /v1 share one port."""
    server = await make_server()
    assert server.openai_url == server.http_url + "/v1"
    async with connect(server.url + "/any/path") as ws:
        await RawClient(ws).hello()

    def post() -> dict:
        body = json.dumps({"prompt": "Hello", "max_tokens": 6}).encode()
        request = urllib.request.Request(
            server.openai_url + "/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    answer = await asyncio.to_thread(post)
    assert answer["choices"][0]["text"] == scripted_text("Hello", 6)
    samples = parse_prometheus((await fetch(server.http_url + "/metrics"))[2])
    assert samples['eclectus_http_responses_total{code="200",route="/v1/completions"}'] == 1
