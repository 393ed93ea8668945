"""``python -m eclectus.benchmarks.routing``: what graph-aware routing buys over a fleet.

Starts ``--engines`` engines (``eclectus serve --model tiny`` processes serving the
OpenAI-compatible API, one torch thread each) and, in this process, the graph server in front
of them with the remote backend. One application asks ``--questions`` questions about each of
``--docs`` documents (every prompt starts with its document's segment), all in one submit,
with ``--max-inflight`` calls in flight at once so later questions are still queued when the
first about a document is dispatched (the scheduler pins the document's prefix). Each routing
policy runs on fresh document texts (so no run profits from another's cache), and the
prompt tokens the engines served from their prefix caches (from each stream's ``usage``), the
wall time and the routing decisions are printed.

``--fronts N`` measures what several fronts (separate front servers, as several
``--api-server-count`` processes or hosts are) know of each other's work: the engines publish
their KV cache events, and each document's questions are split over N fronts, front i
submitting its share ``--stagger`` x i seconds after the first, its documents in its own
order, with the graph policy; the prefilled tokens (prompt tokens not served from a cache) of
one front, of N fronts routing by the engines' events, and of N fronts routing by their own
prediction only, each on fresh documents.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server
from eclectus.server.remote import RemoteConfig, RoutingPolicy, build_remote_backend
from eclectus.server.remote.kv_subscriber import KVEventsEndpoint


def document_frame(
    tag: str, num_docs: int, num_questions: int, share: tuple[int, int] = (0, 1)
) -> dict[str, Any]:
    """One submit: questions over documents, every answer got (pure). ``share`` (i, n):
    only the questions q with q % n == i (one front's part), the documents in an order of
    its own (rotated by i: fronts do not see their requests in one order)."""
    frame: dict[str, Any] = {"type": "submit", "vars": [], "calls": [], "gets": []}
    for d in [(k + share[0]) % num_docs for k in range(num_docs)]:
        text = f"Document {tag}-{d}. " + f"Paragraph {d} says something specific. " * 30
        frame["vars"].append({"id": f"doc{d}", "value": text})
        for q in range(num_questions):
            if q % share[1] != share[0]:
                continue
            answer = f"a{d}_{q}"
            frame["calls"].append(
                {
                    "id": f"q{d}_{q}",
                    "template": f"{{{{doc}}}}\nQuestion {q}: why?\nAnswer:{{{{{answer}}}}}",
                    "bind": {"doc": f"doc{d}", answer: answer},
                    "sampling": {answer: {"max_tokens": 8, "ignore_eos": True}},
                }
            )
            frame["gets"].append({"var": answer})
    return frame


def start_engine(events_port: int | None = None) -> tuple[subprocess.Popen[str], str]:
    """An engine process and its OpenAI base URL (blocks until it listens); with
    ``events_port``, publishing its KV events there (replay on the next port)."""
    command = [sys.executable, "-m", "eclectus", "serve", "--model", "tiny", "--port", "0"]
    command += ["--num-threads", "1", "--num-kv-blocks", "1024"]
    if events_port is not None:
        events = {
            "enable_kv_cache_events": True,
            "endpoint": f"tcp://*:{events_port}",
            "replay_endpoint": f"tcp://*:{events_port + 1}",
        }
        command += ["--kv-events-config", json.dumps(events)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        match = re.search(r"OpenAI API: (http://\S+/v1)\)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError("engine did not start")


async def submit_and_wait(ws: ClientConnection, frame: dict[str, Any]) -> None:
    """Send ``frame`` on an open session and wait for the value of each of its gets."""
    await ws.send(json.dumps(frame))
    pending = len(frame["gets"])
    while pending:
        got = json.loads(await ws.recv())
        if got["type"] == "error":
            raise RuntimeError(got)
        pending -= got["type"] == "value"


async def run_submit(url: str, frame: dict[str, Any], delay_s: float = 0.0) -> None:
    """After ``delay_s``, send ``frame`` on a fresh session and wait for every value."""
    await asyncio.sleep(delay_s)
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        await ws.recv()
        await submit_and_wait(ws, frame)


async def run_fronts(
    urls: list[str], sources: tuple[KVEventsEndpoint, ...], num_fronts: int, tag: str, args: Any
) -> dict[str, Any]:
    """``num_fronts`` front servers, each with its share of every document's questions, at
    once (graph policy; routing by the engines' events when ``sources``)."""
    servers = []
    for _ in range(num_fronts):
        backend = build_remote_backend(RemoteConfig("tiny", tuple(urls), kv_events=sources))
        config = ServerConfig(port=0, max_inflight=args.max_inflight)
        servers.append(await start_server(config, backend, owns_backend=True))
    try:
        await asyncio.sleep(1.0)  # the subscriptions are made
        started = time.perf_counter()
        frames = [
            document_frame(tag, args.docs, args.questions, (i, num_fronts))
            for i in range(num_fronts)
        ]
        delays = [i * args.stagger for i in range(num_fronts)]
        await asyncio.gather(
            *(run_submit(s.url, f, d) for s, f, d in zip(servers, frames, delays, strict=True))
        )
        wall = time.perf_counter() - started
        stats = [s.backend.stats() for s in servers]
        decisions = [dict(s.backend.pool.decisions) for s in servers]
    finally:
        for server in servers:
            await server.close()
    prompt = sum(st.prompt_tokens for st in stats)
    cached = sum(st.cache_hit_tokens for st in stats)
    return {
        "fronts": num_fronts,
        "kv_events": bool(sources),
        "wall_s": round(wall, 2),
        "prompt_tokens": prompt,
        "prefilled": prompt - cached,
        "decisions": decisions,
    }


async def run_policy(
    urls: list[str], policy: RoutingPolicy, args: argparse.Namespace
) -> dict[str, Any]:
    """One policy on a fresh front server: wall time, cache hits, decisions."""
    backend = build_remote_backend(RemoteConfig("tiny", tuple(urls), routing=policy))
    config = ServerConfig(port=0, max_inflight=args.max_inflight)
    async with await start_server(config, backend, owns_backend=True) as server:
        frame = document_frame(policy.value, args.docs, args.questions)
        async with connect(server.url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "hello"}))
            await ws.recv()
            started = time.perf_counter()
            await submit_and_wait(ws, frame)
            wall = time.perf_counter() - started
        stats = backend.stats()
    return {
        "policy": policy.value,
        "wall_s": round(wall, 2),
        "prompt_tokens": stats.prompt_tokens,
        "cache_hit_tokens": stats.cache_hit_tokens,
        "requests_per_engine": [e.num_requests for e in backend.pool.engines],
        "decisions": dict(backend.pool.decisions),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eclectus.benchmarks.routing")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--max-inflight", type=int, default=4)
    parser.add_argument("--fronts", type=int, default=None, metavar="N")
    parser.add_argument("--rounds", type=int, default=1, help="with --fronts: repetitions")
    parser.add_argument(
        "--stagger",
        type=float,
        default=0.5,
        help="with --fronts: seconds between the fronts' submits",
    )
    args = parser.parse_args(argv)
    if args.fronts is not None:
        return fronts_main(args)
    engines = [start_engine() for _ in range(args.engines)]
    try:
        urls = [url for _, url in engines]
        for policy in (RoutingPolicy.GRAPH, RoutingPolicy.LEAST_LOADED, RoutingPolicy.ROUND_ROBIN):
            print(json.dumps(asyncio.run(run_policy(urls, policy, args))), flush=True)
    finally:
        for proc, _ in engines:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


def fronts_main(args: argparse.Namespace) -> int:
    """``--fronts N``: one front, N fronts by events, N fronts by prediction, per round."""
    ports = [free_port_pair() for _ in range(args.engines)]
    engines = [start_engine(port) for port in ports]
    sources = tuple(
        KVEventsEndpoint(f"tcp://127.0.0.1:{p}", f"tcp://127.0.0.1:{p + 1}") for p in ports
    )
    try:
        urls = [url for _, url in engines]
        for round_ in range(args.rounds):
            runs = ((1, sources), (args.fronts, sources), (args.fronts, ()))
            for n, events in runs:
                tag = f"r{round_}-{n}-{bool(events)}"
                print(json.dumps(asyncio.run(run_fronts(urls, events, n, tag, args))), flush=True)
    finally:
        for proc, _ in engines:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


def free_port_pair() -> int:
    """A port p with p and p + 1 free now (the events and replay endpoints)."""
    import socket

    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port


if __name__ == "__main__":
    sys.exit(main())
