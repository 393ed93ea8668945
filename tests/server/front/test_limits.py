"""What keeps one client from hurting the others: connection caps per address, deadlines
for request heads, hello and idle sessions, per-tenant session caps, tenants that come from
the token, and a limit on failed tokens per address."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from scripted_engine import ScriptedEngine
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from ws_helpers import RawClient, ServerFactory, map_reduce

from eclectus.server.config import ServerConfig, read_token_file
from eclectus.server.front.auth import bearer_token
from eclectus.server.front.connections import MAX_HEAD_BYTES
from eclectus.server.front.metrics import parse_prometheus


def tenants(tmp_path: Path) -> tuple[tuple[str, str], ...]:
    path = tmp_path / "tokens"
    path.write_text("# tenant token\nalice tok-a\n\nbob tok-b\n")
    return read_token_file(str(path))


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before closing the connection, failing if it stays open."""
    return await asyncio.wait_for(reader.read(), seconds)


async def test_half_sent_heads_are_capped_and_time_out(make_server: ServerFactory) -> None:
    """Beyond max_connections_per_client a connection gets a 429 at once; the ones held
    with a half-sent head are closed after handshake_timeout_s; others still get served."""
    server = await make_server(max_connections_per_client=4, handshake_timeout_s=0.3)
    held = []
    for _ in range(4):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        held.append((reader, writer))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert (await closed_within(reader, 1)).startswith(b"HTTP/1.1 429")
    for reader, _ in held:
        assert await closed_within(reader, 2) == b""
    async with httpx.AsyncClient() as http:
        assert (await http.get(server.http_url + "/healthz")).status_code == 200


async def test_a_head_over_the_limit_is_refused_in_pieces_or_whole(
    make_server: ServerFactory,
) -> None:
    """A request head still unfinished past MAX_HEAD_BYTES gets a 431 and a closed
    connection, whether its bytes arrive in one write or dribble in; a body of any size
    after a short head is the body limit's business, and keep-alive requests each get a
    fresh allowance."""
    server = await make_server()
    for pieces in (1, 64):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nx-pad: " + b"a" * (MAX_HEAD_BYTES + 1)
        step = len(head) // pieces + 1
        for start in range(0, len(head), step):
            writer.write(head[start : start + step])
            await writer.drain()
        assert (await closed_within(reader, 2)).startswith(b"HTTP/1.1 431")
        writer.close()
    async with httpx.AsyncClient() as http:
        body = {"model": "m" * (MAX_HEAD_BYTES * 2), "prompt": "hi", "max_tokens": 1}
        answer = await http.post(server.openai_url + "/completions", json=body)
        assert answer.status_code == 404 and "does not exist" in answer.text  # the app's answer
        pad = {"x-pad": "a" * (MAX_HEAD_BYTES // 2)}
        for _ in range(3):  # 3 x 8 KiB of heads on one connection: each within the limit
            assert (await http.get(server.http_url + "/healthz", headers=pad)).status_code == 200


async def test_a_connection_without_hello_is_closed(make_server: ServerFactory) -> None:
    server = await make_server(handshake_timeout_s=0.2)
    async with connect(server.url) as ws:
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 2)
        assert ws.close_code == 1001
    assert server.metrics.timeouts["hello"] == 1


async def test_idle_sessions_close_but_busy_ones_stay(make_server: ServerFactory) -> None:
    """A session with nothing in flight is closed after idle_timeout_s; one waiting for a
    value is not, however long the value takes."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine, idle_timeout_s=0.2)
    async with connect(server.url) as idle_ws, connect(server.url) as busy_ws:
        await RawClient(idle_ws).hello()
        busy = RawClient(busy_ws)
        await busy.hello()
        await busy.ask(map_reduce(1))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(idle_ws.recv(), 2)
        assert idle_ws.close_code == 1001
        await asyncio.sleep(0.5)
        engine.release()
        assert (await busy.values(1))["final"]["type"] == "value"


async def test_per_tenant_session_cap(make_server: ServerFactory, tmp_path: Path) -> None:
    server = await make_server(tenant_tokens=tenants(tmp_path), max_sessions_per_tenant=2)
    async with (
        connect(server.url) as a1,
        connect(server.url) as a2,
        connect(server.url) as a3,
        connect(server.url) as b1,
    ):
        await RawClient(a1).hello(token="tok-a")
        await RawClient(a2).hello(token="tok-a")
        refused = await RawClient(a3).ask({"type": "hello", "token": "tok-a"})
        assert refused["code"] == "limit_exceeded" and "tenant" in refused["message"]
        await RawClient(b1).hello(token="tok-b")  # another tenant is unaffected


async def test_the_tenant_is_the_tokens(make_server: ServerFactory, tmp_path: Path) -> None:
    """Engine requests carry the authenticated tenant; claiming another is refused."""
    engine = ScriptedEngine()
    server = await make_server(engine, tenant_tokens=tenants(tmp_path))
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello(token="tok-b")
        await client.ask(map_reduce(1))
        await client.values(1)
    assert {r.tenant for r in engine.requests} == {"bob"}
    async with connect(server.url) as ws:
        refused = await RawClient(ws).ask({"type": "hello", "token": "tok-b", "tenant": "alice"})
        assert (refused["code"], refused["field"]) == ("unauthorized", "tenant")
    async with httpx.AsyncClient() as http:
        body = {"prompt": "hi", "max_tokens": 2}
        headers = {"authorization": "Bearer tok-a"}
        answer = await http.post(server.openai_url + "/completions", json=body, headers=headers)
        assert answer.status_code == 200
    assert engine.requests[-1].tenant == "alice"


async def test_without_auth_everyone_is_one_tenant(make_server: ServerFactory) -> None:
    """Local use: a declared tenant is only a label, the KV tenant is None for all."""
    engine = ScriptedEngine()
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello(tenant="mine")
        await client.ask(map_reduce(1))
        await client.values(1)
    assert {r.tenant for r in engine.requests} == {None}


async def test_failed_tokens_are_rate_limited(make_server: ServerFactory) -> None:
    """After max_auth_failures wrong tokens from one address, even the right token is
    refused (429 over HTTP, no upgrade for the WebSocket) until the window passes."""
    server = await make_server(token="right", max_auth_failures=3, auth_window_s=0.5)
    url = server.openai_url + "/models"
    async with httpx.AsyncClient() as http:
        for _ in range(3):
            answer = await http.get(url, headers={"authorization": "Bearer wrong"})
            assert answer.status_code == 401
        answer = await http.get(url, headers={"authorization": "Bearer right"})
        assert answer.status_code == 429 and answer.json()["error"]["type"] == "rate_limit_error"
        spoofed = {"authorization": "Bearer right", "x-forwarded-for": "10.9.8.7"}
        assert (await http.get(url, headers=spoofed)).status_code == 429  # the socket's peer
        with pytest.raises(InvalidStatus):
            async with connect(server.url):
                pass
        await asyncio.sleep(0.6)
        assert (await http.get(url, headers={"authorization": "Bearer right"})).status_code == 200
    samples = server.metrics_text()
    assert "eclectus_auth_failures_total 3.0" in samples


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer abc") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token(None) is None and bearer_token("Bearer ") is None


def test_token_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("alice tok-a\nbob\n")
    with pytest.raises(ValueError, match="line 2"):
        read_token_file(str(path))
    with pytest.raises(ValueError, match="shares its token"):
        ServerConfig(tenant_tokens=(("a", "t"), ("b", "t")))
    with pytest.raises(ValueError, match="token file"):
        read_token_file(str(tmp_path / "missing"))


async def test_metrics_count_per_tenant_but_say_nothing_of_prompts(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    """/metrics (open, as vLLM's) has sessions per tenant and refusals by reason, rendered
    by prometheus-client; token and cache counters carry no tenant label."""
    server = await make_server(tenant_tokens=tenants(tmp_path))
    async with connect(server.url) as a, connect(server.url) as b:
        await RawClient(a).hello(token="tok-a")
        client = RawClient(b)
        await client.hello(token="tok-b")
        await client.ask({"type": "get", "var": "nothing"})
        async with httpx.AsyncClient() as http:
            page = (await http.get(server.http_url + "/metrics")).text
    samples = parse_prometheus(page)
    assert samples['eclectus_tenant_sessions{tenant="alice"}'] == 1
    assert samples['eclectus_tenant_sessions{tenant="bob"}'] == 1
    assert samples['eclectus_rejected_frames_total{reason="unknown_var"}'] == 1
    assert samples["eclectus_pinned_prefixes"] == 0
    assert samples["eclectus_sessions"] == 2 and samples["eclectus_sessions_total"] == 2
    tenant_lines = [line for line in page.splitlines() if "tenant=" in line]
    assert all(line.startswith("eclectus_tenant_sessions{") for line in tenant_lines)
    assert "# TYPE eclectus_prompt_tokens_total counter" in page
