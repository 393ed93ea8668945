"""Load and isolation test: can any client hurt another? Loopback only, bounded in count and time.

    python -m eclectus.benchmarks.loadtest [--quick] [--url ws://127.0.0.1:PORT]
                                       [--openai-url http://127.0.0.1:PORT/v1] [--sessions 200]

Without ``--url`` it starts ``eclectus serve --model tiny`` in a subprocess on a free
loopback port (so the server's RSS is measured on its own), with the per-address and
per-tenant caps lifted (every client here is one address and one tenant), and stops it at the
end. The OpenAI endpoints are found at ``--openai-url``, else at ``<server>/v1``.

While the scenarios run, a *canary* session (an innocent tenant) round-trips a tokenize frame
every 20 ms and keeps a small generation going; its worst round trip during a scenario is that
scenario's "stall", and any of its generations that fails counts against the scenario.

Scenarios: concurrent SDK sessions; OpenAI clients (plain and streamed); slow readers (must be
disconnected with 1008); abrupt disconnects mid-generation; the bad-input table (each must be
answered with its error code); adversarial submits (a ladder of ops, a 4,094-call submit, a
flood of gets, sampling values out of range, deep JSON); a flood of /v1 token-id prompts (what
a remote Eclectus sends: scheduled graph calls, so they queue behind the in-flight cap; the row
notes the peak in flight and queued); then churn: thousands of short
sessions, after which nothing may be left behind (sessions, scheduler work, KV blocks, pins).
Prints one row per scenario and the targets met or missed; exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.uri import parse_uri

MAP = "Summarize:\n{{doc}}\nSummary:{{summary}}"
REDUCE = "Combine:\n{{all}}\nFinal:{{final}}"
STALL_TARGET_S = 0.100
ATTACKS = ("slow readers", "abrupt disconnects", "bad-input table")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, slots=True)
class Plan:
    """How big each scenario is (``quick``: under a minute on a 2-core machine)."""

    concurrent: int = 200
    openai: int = 32
    slow_readers: int = 4
    disconnects: int = 50
    churn: int = 3_000
    churn_parallel: int = 50
    get_flood: int = 100_000
    max_tokens: int = 8
    scenario_timeout_s: float = 300.0
    token_flood: int = 8  # /v1 requests of 64 token-id prompts each, all at once

    @classmethod
    def quick(cls) -> Plan:
        return cls(20, 6, 2, 10, 150, 25, 5_000, 4, 60.0, 2)


@dataclass(slots=True)
class Row:
    """One scenario's outcome. ``held``: answered as it should be (a value, or the expected
    refusal); ``errored``: answered otherwise; ``lost``: never answered."""

    name: str
    attack: bool = False  # an attacker drives it: the stall target applies
    held: int = 0
    errored: int = 0
    lost: int = 0
    latencies: list[float] = field(default_factory=list)
    stall_s: float = 0.0  # the canary's worst round trip during the scenario
    innocent_failed: int = 0  # canary generations that failed during the scenario
    notes: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return self.held + self.errored + self.lost

    def percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[int(q) - 1]


@dataclass(slots=True)
class Report:
    rows: list[Row] = field(default_factory=list)
    rss_before_mb: float | None = None
    rss_after_mb: float | None = None
    leaks: dict[str, float] = field(default_factory=dict)  # what churn left behind

    @property
    def lost(self) -> int:
        return sum(r.lost for r in self.rows)

    @property
    def errored(self) -> int:
        return sum(r.errored for r in self.rows)

    @property
    def innocent_failed(self) -> int:
        return sum(r.innocent_failed for r in self.rows)

    @property
    def worst_stall_s(self) -> float:
        return max((r.stall_s for r in self.rows), default=0.0)

    @property
    def worst_attack_stall_s(self) -> float:
        """The worst stall during the scenarios an attacker drives (the stall target's
        scope; under plain load the canary's round trip is queueing, not an attack)."""
        return max((r.stall_s for r in self.rows if r.attack), default=0.0)

    def misses(self) -> list[str]:
        """The targets not met (pure)."""
        out = []
        if self.lost:
            out.append(f"{self.lost} requests lost")
        if self.errored:  # answered, but not as they should be (e.g. refused by a cap)
            out.append(f"{self.errored} requests answered wrongly")
        if any(self.leaks.values()):
            out.append(f"left behind: {self.leaks}")
        if self.innocent_failed:
            out.append(f"{self.innocent_failed} innocent requests failed")
        if self.worst_attack_stall_s > STALL_TARGET_S:
            stall = _ms(self.worst_attack_stall_s)
            out.append(f"an attack stalled the innocent session {stall} ms")
        return out


# -- the canary: an innocent tenant ------------------------------------------------------------


class Canary:
    """An innocent tenant in its own process (so the attacker's client work here cannot slow
    it): it round-trips tokenize frames and keeps a generation going; :meth:`reset` returns
    its worst round trip and its failed generations since the previous reset."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.url, self.max_tokens = url, max_tokens

    async def __aenter__(self) -> Canary:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        args = (self.url, self.max_tokens, child)
        self._proc = context.Process(target=_canary_main, args=args, daemon=True)
        self._proc.start()
        await asyncio.to_thread(self._conn.recv)  # "ready"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._conn.send("stop")
        await asyncio.to_thread(self._proc.join, 30)
        if self._proc.is_alive():
            self._proc.kill()

    async def reset(self) -> tuple[float, int]:
        """The worst round trip (s) and failed generations since the last reset."""
        self._conn.send("reset")
        return await asyncio.to_thread(self._conn.recv)


def _canary_main(url: str, max_tokens: int, conn: Connection) -> None:
    asyncio.run(_canary(url, max_tokens, conn))


async def _canary(url: str, max_tokens: int, conn: Connection) -> None:
    from eclectus.adapters.client.connect import connect

    state = {"worst": 0.0, "failed": 0}

    async def ping(ws: ClientConnection) -> None:
        for i in range(10**9):
            start = time.perf_counter()
            await _ask(ws, {"type": "tokenize", "id": f"p{i}", "text": "canary"})
            state["worst"] = max(state["worst"], time.perf_counter() - start)
            await asyncio.sleep(0.02)

    async def generate() -> None:
        async with connect(url, tenant="canary-gen", app="canary") as app:
            say = app.function("Canary {{n}} says:{{out}}", out=dict(max_tokens=max_tokens))
            for i in range(10**9):
                try:
                    await asyncio.wait_for(say(n=str(i)).aget("latency"), 60)  # type: ignore[union-attr]
                except Exception:
                    state["failed"] += 1

    async with ws_connect(url) as ws:
        await _ask(ws, {"type": "hello", "tenant": "canary"})
        tasks = [asyncio.create_task(ping(ws)), asyncio.create_task(generate())]
        conn.send("ready")
        while await asyncio.to_thread(conn.recv) == "reset":
            conn.send((state["worst"], state["failed"]))
            state["worst"], state["failed"] = 0.0, 0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- scenarios ---------------------------------------------------------------------------------


async def concurrent_sessions(url: str, plan: Plan, row: Row) -> None:
    """``plan.concurrent`` SDK sessions at once, each a 2-document map-reduce with a get."""
    from eclectus.adapters.client.connect import connect

    async def one(i: int) -> None:
        async with connect(url, tenant=f"t{i % 7}", app=f"load{i}") as app:
            summarize = app.function(MAP, summary=dict(max_tokens=plan.max_tokens))
            combine = app.function(REDUCE, final=dict(max_tokens=plan.max_tokens))
            sums = [summarize(doc=f"Report {i}.{k}: {i * k % 13} events.") for k in (1, 2)]
            final = combine(all=app.join(sums, sep="\n"))  # type: ignore[arg-type]
            await asyncio.wait_for(final.aget("latency"), plan.scenario_timeout_s)  # type: ignore[union-attr]

    def note(exc: Exception) -> str:
        return f"{type(exc).__name__}: {exc}"

    await asyncio.gather(*(_sdk_outcome(row, one(i), note) for i in range(plan.concurrent)))


async def openai_clients(openai_url: str | None, plan: Plan, row: Row) -> None:
    """Chat completions at once, half of them streamed."""
    if openai_url is None:
        row.notes.append("no OpenAI endpoint found: skipped")
        return
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": plan.max_tokens}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        start = time.perf_counter()
        payload = {**body, "model": "tiny", "stream": i % 2 == 1}
        try:
            if payload["stream"]:
                async with client.stream("POST", "/chat/completions", json=payload) as resp:
                    text = "".join([chunk async for chunk in resp.aiter_text()])
                    ok = resp.status_code == 200 and "[DONE]" in text
            else:
                resp = await client.post("/chat/completions", json=payload)
                ok = resp.status_code == 200 and resp.json()["choices"]
            if ok:
                row.held += 1
                row.latencies.append(time.perf_counter() - start)
            else:
                row.errored += 1
                row.notes.append(f"HTTP {resp.status_code}")
        except httpx.HTTPError:
            row.lost += 1

    timeout = httpx.Timeout(plan.scenario_timeout_s)
    async with httpx.AsyncClient(base_url=openai_url, timeout=timeout) as client:
        await asyncio.gather(*(one(client, i) for i in range(plan.openai)))


async def slow_readers(url: str, plan: Plan, row: Row) -> None:
    """Clients that never read their socket and ask for 100 MB of answers: each must be
    disconnected once its outbox passes max_outbox_bytes (the close frame cannot get through
    a full socket, so the server drops the connection after its close timeout)."""

    async def one(i: int) -> None:
        reader, writer, protocol = await deaf_client(url)
        try:
            send_frame(writer, protocol, {"type": "hello", "tenant": f"slow{i}"})
            value = {"id": "v", "value": "x" * 500_000}
            send_frame(writer, protocol, {"type": "submit", "id": "s", "vars": [value]})
            for k in range(200):
                send_frame(writer, protocol, {"type": "get", "id": f"g{k}", "var": "v"})
                await writer.drain()
            # the server must hang up: reading now finds the end of the stream in time
            async with asyncio.timeout(plan.scenario_timeout_s):
                await asyncio.sleep(1.0)
                while await reader.read(1 << 20):
                    pass
            row.held += 1
        except (ConnectionError, OSError):
            row.held += 1  # reset by the server: dropped as it should be
        except TimeoutError:
            row.lost += 1
            row.notes.append("a client that reads nothing was never disconnected")
        finally:
            writer.close()

    await asyncio.gather(*(one(i) for i in range(plan.slow_readers)))


async def deaf_client(
    url: str,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, ClientProtocol]:
    """A WebSocket client on a socket with a small receive buffer that nobody reads after
    the handshake (the websockets client library would buffer everything in memory)."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (parts.hostname, parts.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    protocol = ClientProtocol(parse_uri(url))
    protocol.send_request(protocol.connect())
    writer.write(b"".join(protocol.data_to_send()))
    while protocol.handshake_exc is None and not protocol.events_received():
        protocol.receive_data(await reader.read(4096))
        if protocol.state is not State.CONNECTING:
            break
    return reader, writer, protocol


def send_frame(writer: asyncio.StreamWriter, protocol: ClientProtocol, frame: dict) -> None:
    protocol.send_text(json.dumps(frame).encode())
    writer.write(b"".join(protocol.data_to_send()))


async def abrupt_disconnects(url: str, plan: Plan, row: Row) -> None:
    """Sessions that start a map-reduce and drop the TCP connection mid-generation."""

    async def one(i: int) -> None:
        ws = await ws_connect(url, max_size=None)
        await _ask(ws, {"type": "hello", "tenant": f"drop{i % 3}"})
        await ws.send(json.dumps(_map_reduce(4, plan.max_tokens * 4, f"drop{i}")))
        await asyncio.sleep(0.05 + 0.01 * (i % 20))
        ws.transport.abort()  # no close frame: a client that vanished
        row.held += 1

    await asyncio.gather(*(one(i) for i in range(plan.disconnects)))


def _submit_one(segments: list[dict[str, Any]]) -> str:
    return json.dumps({"type": "submit", "calls": [{"id": "c", "segments": segments}]})


def _sampled(**sampling: Any) -> str:
    return _submit_one([{"text": "a"}, {"gen": "o", "sampling": {"temperature": 1, **sampling}}])


DEEP = 100_000
BAD_INPUTS: list[tuple[str, str, str]] = [
    ("not JSON", "{nope", "bad_request"),
    ("unknown frame type", '{"type": "launch"}', "unknown_type"),
    ("field of the wrong type", '{"type": "get", "var": 5}', "bad_request"),
    ("unknown variable", '{"type": "get", "var": "ghost"}', "unknown_var"),
    ("lone surrogate id", '{"type": "get", "id": "\\ud800", "var": "x"}', "bad_request"),
    ("lone surrogate text", _submit_one([{"text": "\udfff"}, {"gen": "o"}]), "bad_request"),
    ("nested 100k deep", '{"type": "get", "var": ' + "[" * DEEP + "]" * DEEP + "}", "bad_request"),
    (
        "over max_frame_bytes",
        json.dumps({"type": "tokenize", "text": "x" * 2**20}),
        "limit_exceeded",
    ),
    ("top_k 2**70", _sampled(top_k=2**70), "bad_request"),
    ("seed 2**80", _sampled(seed=2**80), "bad_request"),
    ("a cycle", _submit_one([{"var": "o"}, {"gen": "o"}]), "cycle"),
    (
        "prompt over the limit",
        _submit_one([{"text": "w " * 20_000}, {"gen": "o"}]),
        "limit_exceeded",
    ),
]


async def bad_inputs(url: str, plan: Plan, row: Row) -> None:
    """Each bad frame gets its error code, and the session keeps working."""
    async with ws_connect(url, max_size=None) as ws:
        await _ask(ws, {"type": "hello", "tenant": "bad"})
        for name, frame, code in BAD_INPUTS:
            try:
                await ws.send(frame)
                reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                fine = await _ask(ws, {"type": "tokenize", "id": "ok", "text": "x"})
            except (TimeoutError, ConnectionClosed):
                row.lost += 1
                row.notes.append(f"{name}: no answer")
                return
            if reply.get("code") == code and fine["type"] == "tokens":
                row.held += 1
            else:
                row.errored += 1
                row.notes.append(f"{name}: got {reply.get('code')}, expected {code}")


@contextlib.asynccontextmanager
async def _attacker(url: str) -> AsyncIterator[ClientConnection]:
    # no keepalive: a ping queued behind 100,000 frames of its own would time the attacker out
    async with ws_connect(url, max_size=None, ping_interval=None) as ws:
        await _ask(ws, {"type": "hello", "tenant": "attacker"})
        yield ws


async def _expect(
    ws: ClientConnection, plan: Plan, row: Row, frame: dict[str, Any], ok: Callable[[dict], bool]
) -> None:
    """Send ``frame``; its answer is held when ``ok`` says so."""
    try:
        reply = await asyncio.wait_for(_ask(ws, frame), plan.scenario_timeout_s)
    except (TimeoutError, ConnectionClosed):
        row.lost += 1
        return
    if ok(reply):
        row.held += 1
    else:
        row.errored += 1
        row.notes.append(str(reply)[:100])


async def ladder_of_ops(url: str, plan: Plan, row: Row) -> None:
    """Ops over ops, 2**25 paths and texts doubling per level: answered at once, and the
    op that would pass max_frame_bytes fails with limit_exceeded."""
    async with _attacker(url) as ws:
        await _expect(ws, plan, row, _ladder(25), lambda r: r["type"] == "ack")
        reply = json.loads(await asyncio.wait_for(ws.recv(), plan.scenario_timeout_s))
        row.held += reply.get("code") == "limit_exceeded"
        row.errored += reply.get("code") != "limit_exceeded"


async def big_submit(url: str, plan: Plan, row: Row) -> None:
    """4,000 calls on a 2 KB constant (the session limit is 4,096 calls)."""
    frame = {
        "type": "submit",
        "id": "big",
        "vars": [{"id": "const", "value": "lorem ipsum " * 170}],
        "calls": [
            {"id": f"c{i}", "segments": [{"var": "const"}, {"gen": f"o{i}"}]} for i in range(4_000)
        ],
    }
    async with _attacker(url) as ws:
        await _expect(ws, plan, row, frame, lambda r: r["type"] == "ack")


async def get_flood(url: str, plan: Plan, row: Row) -> None:
    """Streamed gets on one unset variable, then setting it: the gets past the per-session
    cap are refused, the rest answered once."""
    async with _attacker(url) as ws:
        await _ask(ws, {"type": "submit", "id": "u", "vars": [{"id": "unset"}]})
        start = time.perf_counter()
        counting = asyncio.create_task(_count_until(ws, "set", plan.scenario_timeout_s))
        for k in range(plan.get_flood):
            get = {"type": "get", "id": f"g{k}", "var": "unset", "stream": True}
            await ws.send(json.dumps(get))
            if k % 64 == 0:
                await asyncio.sleep(0)  # let the counter read: else this is a slow reader too
        await ws.send(json.dumps({"type": "set", "id": "set", "var": "unset", "value": "v"}))
        try:
            answers = await counting
        except ConnectionClosed as exc:
            # the server shed the flooder: 1008, it read too slowly; 1011, its pong waited
            # behind its own backlog of frames past the keepalive timeout
            closed_by_server = exc.rcvd is not None and exc.rcvd.code in (1008, 1011)
            row.held += closed_by_server
            row.lost += not closed_by_server
            row.notes.append(f"the flooding session was closed: {exc}")
            return
        seconds = time.perf_counter() - start
        row.notes.append(f"{plan.get_flood} gets in {seconds:.1f} s: {answers}")
        refused, values = answers.get("limit_exceeded", 0), answers.get("value", 0)
        if refused and refused + values == plan.get_flood:
            row.held += 1
        else:
            row.errored += 1


async def openai_out_of_range(openai_url: str | None, plan: Plan, row: Row) -> None:
    """Sampling values no engine can use are a 400, never a 500 for anyone."""
    if openai_url is None:
        row.notes.append("no OpenAI endpoint found: skipped")
        return
    async with httpx.AsyncClient(base_url=openai_url, timeout=30) as client:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        for name, extra in (("top_k", {"top_k": 2**70}), ("seed", {"seed": 2**80})):
            resp = await client.post("/chat/completions", json={**body, **extra})
            if resp.status_code == 400:
                row.held += 1
            else:
                row.errored += 1
                row.notes.append(f"{name} out of range: HTTP {resp.status_code}")


async def token_prompt_flood(openai_url: str | None, plan: Plan, row: Row) -> None:
    """``plan.token_flood`` /v1 completions at once from one client, each 64 token-id
    prompts (what a remote Eclectus sends), while /metrics is polled: they are graph calls,
    so the scheduler's cap bounds what reaches the engine and the rest queue in app-FIFO
    (the canary's work is not starved). Notes the peaks seen."""
    if openai_url is None:
        row.notes.append("no OpenAI endpoint found: skipped")
        return
    http_url = openai_url.removesuffix("/v1")
    prompts = [[100 + i, 200 + i, 300 + i] * 8 for i in range(64)]
    body = {"model": "tiny", "prompt": prompts, "max_tokens": plan.max_tokens}
    names = ("inflight", "queue_depth", "engine_running", "engine_waiting")
    peaks = {f"eclectus_{name}": 0.0 for name in names}

    async def watch() -> None:
        while True:
            m = await asyncio.to_thread(_metrics, http_url)
            for name in peaks:
                peaks[name] = max(peaks[name], m.get(name, 0.0))
            await asyncio.sleep(0.05)

    async def one(client: httpx.AsyncClient) -> None:
        start = time.perf_counter()
        try:
            resp = await client.post("/completions", json=body)
        except httpx.HTTPError:
            row.lost += 1
            return
        choices = resp.json().get("choices", []) if resp.status_code == 200 else []
        if len(choices) == len(prompts) and all(c.get("token_ids") for c in choices):
            row.held += 1
            row.latencies.append(time.perf_counter() - start)
        else:
            row.errored += 1
            row.notes.append(f"HTTP {resp.status_code}")

    watcher = asyncio.create_task(watch())
    timeout = httpx.Timeout(plan.scenario_timeout_s)
    try:
        async with httpx.AsyncClient(base_url=openai_url, timeout=timeout) as client:
            await asyncio.gather(*(one(client) for _ in range(plan.token_flood)))
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    calls = plan.token_flood * len(prompts)
    row.notes.append(
        f"{calls} token-id calls: peak in flight {peaks['eclectus_inflight']:g}, "
        f"peak queued {peaks['eclectus_queue_depth']:g}; in the engine: peak running "
        f"{peaks['eclectus_engine_running']:g}, peak waiting {peaks['eclectus_engine_waiting']:g}"
    )


async def churn(url: str, plan: Plan, row: Row) -> None:
    """Many short sessions (a call and a get each), ``churn_parallel`` at a time."""
    gate = asyncio.Semaphore(plan.churn_parallel)

    async def one(i: int) -> None:
        async with gate:
            await _short_session(url, plan, row, i)

    await asyncio.gather(*(one(i) for i in range(plan.churn)))


async def _short_session(url: str, plan: Plan, row: Row, i: int) -> None:
    """One SDK session: a call, a get, close."""
    from eclectus.adapters.client.connect import connect

    async def session() -> None:
        async with connect(url, tenant=f"c{i % 5}", app="churn") as app:
            say = app.function("Note {{n}}:{{out}}", out=dict(max_tokens=2))
            await asyncio.wait_for(say(n=str(i)).aget("latency"), plan.scenario_timeout_s)  # type: ignore[union-attr]

    await _sdk_outcome(row, session(), str)


async def _sdk_outcome(
    row: Row, session: Awaitable[None], note: Callable[[Exception], str]
) -> None:
    """Awaits one SDK scenario and counts its outcome in ``row`` (mutates ``row``): held,
    with its latency; lost on a timeout or a lost connection; errored on any other client
    error, with ``note(error)`` (cut to 120 characters) among the notes."""
    from eclectus.adapters.client.errors import ConnectionError as LostError
    from eclectus.adapters.client.errors import EclectusClientError

    start = time.perf_counter()
    try:
        await session
        row.held += 1
        row.latencies.append(time.perf_counter() - start)
    except (TimeoutError, LostError, OSError):
        row.lost += 1
    except EclectusClientError as exc:
        row.errored += 1
        row.notes.append(note(exc)[:120])


# -- helpers -----------------------------------------------------------------------------------


async def _ask(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send a frame and read until the answer carrying its id (or the first, without one)."""
    await ws.send(json.dumps(frame))
    while True:
        reply = json.loads(await ws.recv())
        if "id" not in frame or reply.get("id") == frame["id"]:
            return reply


async def _drain(ws: ClientConnection, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                await ws.recv()


async def _count_until(ws: ClientConnection, frame_id: str, timeout: float) -> dict[str, int]:
    """Count answers by kind (value, delta, error code) until the ack of ``frame_id`` and
    then until the stream goes quiet for a second."""
    counts: dict[str, int] = {}
    acked = False
    async with asyncio.timeout(timeout):
        while True:
            try:
                reply = json.loads(await asyncio.wait_for(ws.recv(), 1.0 if acked else timeout))
            except TimeoutError:
                return counts
            acked = acked or reply.get("id") == frame_id
            kind = reply.get("code") or reply["type"]
            counts[kind] = counts.get(kind, 0) + 1


def _ladder(depth: int) -> dict[str, Any]:
    ops = []
    for i in range(1, depth + 1):
        ops.append(
            {"id": f"oa{i}", "op": "join", "inputs": [f"a{i - 1}", f"b{i - 1}"], "output": f"a{i}"}
        )
        ops.append(
            {"id": f"ob{i}", "op": "join", "inputs": [f"b{i - 1}", f"a{i - 1}"], "output": f"b{i}"}
        )
    return {
        "type": "submit",
        "id": "ladder",
        "vars": [{"id": "a0", "value": "x"}, {"id": "b0", "value": "y"}],
        "ops": ops,
        "gets": [{"var": f"a{depth}", "criteria": "latency"}],
    }


def _map_reduce(num_maps: int, max_tokens: int, tag: str) -> dict[str, Any]:
    sampling = {"max_tokens": max_tokens}
    calls = [
        {
            "id": f"m{i}",
            "segments": [{"text": f"{tag} doc {i}:"}, {"gen": f"s{i}", "sampling": sampling}],
        }
        for i in range(num_maps)
    ]
    calls.append({"id": "r", "segments": [{"var": "j"}, {"gen": "final", "sampling": sampling}]})
    ops = [{"id": "jo", "op": "join", "inputs": [f"s{i}" for i in range(num_maps)], "output": "j"}]
    gets = [{"var": "final"}]
    return {"type": "submit", "id": "mr", "calls": calls, "ops": ops, "gets": gets}


def _metrics(http_url: str) -> dict[str, float]:
    from eclectus.server.front.metrics import parse_prometheus

    return parse_prometheus(httpx.get(f"{http_url}/metrics", timeout=10).text)


async def _settled(http_url: str, timeout: float) -> dict[str, float]:
    """Wait until the server is idle, then what it still holds that it should not."""
    deadline = time.monotonic() + timeout
    while True:
        m = await asyncio.to_thread(_metrics, http_url)
        leaks = {
            "sessions": m.get("eclectus_sessions", 0),
            "scheduler_work": m.get("eclectus_inflight", 0) + m.get("eclectus_queue_depth", 0),
            "engine_requests": m.get("eclectus_engine_running", 0)
            + m.get("eclectus_engine_waiting", 0),
            "blocks_held": m.get("eclectus_engine_total_blocks", 0)
            - m.get("eclectus_engine_free_blocks", 0),
        }
        if not any(leaks.values()) or time.monotonic() > deadline:
            return leaks
        await asyncio.sleep(0.5)


def _rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def local_server() -> Iterator[tuple[str, str | None, int]]:
    """``eclectus serve --model tiny`` on free loopback ports; yields (ws url, separate
    OpenAI url or None, pid) and stops it on exit."""
    port = _free_port()
    cmd = [sys.executable, "-m", "eclectus", "serve", "--model", "tiny", "--port", str(port)]
    cmd += ["--log-level", "WARNING", "--max-sessions", "512"]
    # every client here is 127.0.0.1 and, without tokens, one tenant: lift both caps
    cmd += ["--max-connections-per-client", "1024", "--max-sessions-per-tenant", "512"]
    openai_url = None  # /v1 on the same port
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"loadtest: the server did not start ({' '.join(cmd)})")
            time.sleep(0.3)
        yield f"ws://127.0.0.1:{port}", openai_url, proc.pid
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        if proc.poll() is None:
            proc.kill()


def find_openai(ws_url: str, given: str | None, separate: str | None) -> str | None:
    """The OpenAI base URL: given, else ``/v1`` on the WebSocket's port, else the separate
    port's (pure apart from one probe)."""
    if given is not None:
        return given.rstrip("/")
    same_port = "http" + ws_url.removeprefix("ws").rstrip("/") + "/v1"
    with contextlib.suppress(httpx.HTTPError):
        if httpx.get(f"{same_port}/models", timeout=5).status_code == 200:
            return same_port
    return separate


# -- running and reporting ---------------------------------------------------------------------


async def run(
    url: str, openai_url: str | None, plan: Plan, server_pid: int | None = None
) -> Report:
    """Run every scenario against the server at ``url`` (loopback) and report (mutates
    nothing of the caller's)."""
    http_url = "http" + url.removeprefix("ws").rstrip("/")
    report = Report(rss_before_mb=_rss_mb(server_pid))
    scenarios: list[tuple[str, Callable[[Row], Awaitable[None]]]] = [
        ("concurrent SDK sessions", lambda r: concurrent_sessions(url, plan, r)),
        ("OpenAI clients", lambda r: openai_clients(openai_url, plan, r)),
        ("slow readers", lambda r: slow_readers(url, plan, r)),
        ("abrupt disconnects", lambda r: abrupt_disconnects(url, plan, r)),
        ("bad-input table", lambda r: bad_inputs(url, plan, r)),
        ("adversarial: ladder of ops", lambda r: ladder_of_ops(url, plan, r)),
        ("adversarial: 4,000-call submit", lambda r: big_submit(url, plan, r)),
        (f"adversarial: {plan.get_flood} gets", lambda r: get_flood(url, plan, r)),
        ("adversarial: OpenAI out of range", lambda r: openai_out_of_range(openai_url, plan, r)),
        ("adversarial: token-prompt flood", lambda r: token_prompt_flood(openai_url, plan, r)),
        (f"churn ({plan.churn} sessions)", lambda r: churn(url, plan, r)),
    ]
    async with Canary(url, plan.max_tokens) as canary:
        await asyncio.sleep(0.5)
        for name, scenario in scenarios:
            row = Row(name, attack=name in ATTACKS or name.startswith("adversarial"))
            _progress(f"{name} ...")
            await canary.reset()
            start = time.perf_counter()
            try:
                async with _ticker(name, row, start):
                    await asyncio.wait_for(scenario(row), plan.scenario_timeout_s * 2)
            except TimeoutError:
                row.notes.append("scenario timed out")
                row.lost += 1
            row.stall_s, row.innocent_failed = await canary.reset()
            report.rows.append(row)
            _progress(f"{name}: {_summary(row)} in {time.perf_counter() - start:.1f} s")
    _progress("waiting for the server to settle ...")
    report.leaks = await _settled(http_url, 60)
    report.rss_after_mb = _rss_mb(server_pid)
    return report


@contextlib.asynccontextmanager
async def _ticker(name: str, row: Row, start: float) -> AsyncIterator[None]:
    async def tick() -> None:
        while True:
            await asyncio.sleep(5)
            _progress(f"  {name}: {_summary(row)} after {time.perf_counter() - start:.0f} s")

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()


def _summary(row: Row) -> str:
    return f"{row.held} held, {row.errored} errored, {row.lost} lost"


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def format_report(report: Report) -> str:
    """The table and the targets (pure)."""
    head = ("scenario", "requests", "held", "errored", "lost", "p50 ms", "p99 ms")
    head += ("stall ms", "innocent failed")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in report.rows:
        cells = (r.name, r.requests, r.held, r.errored, r.lost, _ms(r.percentile(50)))
        cells += (_ms(r.percentile(99)), _ms(r.stall_s), r.innocent_failed)
        lines.append(" | ".join(str(c) for c in cells))
    rss = (report.rss_before_mb, report.rss_after_mb)
    lines.append("")
    if None not in rss:
        lines.append(f"server RSS: {rss[0]:.0f} MB before, {rss[1]:.0f} MB after")
    lines.append(
        "left behind after churn: " + ", ".join(f"{k} {v:g}" for k, v in report.leaks.items())
    )
    lines.append(
        f"worst stall of the innocent session: {_ms(report.worst_attack_stall_s)} ms during "
        f"attacks (target {_ms(STALL_TARGET_S)} ms), {_ms(report.worst_stall_s)} ms in all"
    )
    for r in report.rows:
        lines += [f"  {r.name}: {note}" for note in r.notes[:6]]
    misses = report.misses()
    lines.append("targets: " + ("all met" if not misses else "MISSED: " + "; ".join(misses)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eclectus.benchmarks.loadtest", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "--url", help="a running server's ws:// URL on loopback (default: start one)"
    )
    parser.add_argument("--openai-url", help="its OpenAI base URL, e.g. http://127.0.0.1:8765/v1")
    parser.add_argument("--server-pid", type=int, help="the running server's pid, for its RSS")
    parser.add_argument("--quick", action="store_true", help="small sizes: under a minute")
    parser.add_argument("--sessions", type=int, help="concurrent SDK sessions (default 200)")
    parser.add_argument("--churn", type=int, help="short sessions for the leak check (3000)")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    if args.sessions is not None or args.churn is not None:
        sizes = {"concurrent": args.sessions, "churn": args.churn}
        plan = dataclasses.replace(plan, **{k: v for k, v in sizes.items() if v is not None})
    if args.url is not None and urlsplit(args.url).hostname not in LOOPBACK:
        print(f"loadtest: {args.url} is not a loopback address", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.url is None:
            url, separate, pid = stack.enter_context(local_server())
        else:
            url, separate, pid = args.url, None, args.server_pid
        openai_url = find_openai(url, args.openai_url, separate)
        report = asyncio.run(run(url, openai_url, plan, pid))
    print(format_report(report))
    return 1 if report.misses() else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
