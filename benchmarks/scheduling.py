"""``python -m eclectus.benchmarks.scheduling``: what objective-aware scheduling buys a waiting
user.

One server (the built-in engine, ``tiny`` by default) with a small in-flight limit, so the
scheduler's order matters. A background application submits a batch of throughput calls;
right after, a second application submits a map-reduce (4 maps + 1 reduce) and waits for the
answer. The map-reduce's get is asked once with ``criteria="latency"`` and once with
``"throughput"`` (fresh servers, same engine), and the wall time to its value is printed with
the ratio. Raw protocol frames: the SDK is not needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from eclectus.server.backend import Backend
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import build_backend, start_server


def background_frame(num_calls: int, max_tokens: int) -> dict[str, Any]:
    calls = [
        {
            "id": f"b{i}",
            "segments": [
                {"text": f"Background task {i}: write a long essay."},
                {"gen": f"o{i}", "sampling": {"max_tokens": max_tokens, "ignore_eos": True}},
            ],
        }
        for i in range(num_calls)
    ]
    gets = [{"var": f"o{i}", "criteria": "throughput"} for i in range(num_calls)]
    return {"type": "submit", "calls": calls, "gets": gets}


def map_reduce_frame(criteria: str, max_tokens: int) -> dict[str, Any]:
    sampling = {"max_tokens": max_tokens, "ignore_eos": True}
    calls: list[dict[str, Any]] = [
        {
            "id": f"m{i}",
            "template": "Summarize note {{n}}:{{s}}",
            "bind": {"n": f"n{i}", "s": f"s{i}"},
            "sampling": {"s": sampling},
        }
        for i in range(4)
    ]
    calls.append(
        {
            "id": "r",
            "template": "Combine:{{a}}{{b}}{{c}}{{d}}\nFinal:{{f}}",
            "bind": {"a": "s0", "b": "s1", "c": "s2", "d": "s3", "f": "f"},
            "sampling": {"f": sampling},
        }
    )
    return {
        "type": "submit",
        "vars": [{"id": f"n{i}", "value": str(i)} for i in range(4)],
        "calls": calls,
        "gets": [{"var": "f", "criteria": criteria}],
    }


async def open_session(url: str) -> ClientConnection:
    ws = await connect(url, max_size=None)
    await ws.send(json.dumps({"type": "hello"}))
    await ws.recv()
    return ws


async def until_values(ws: ClientConnection, num: int) -> None:
    while num:
        frame = json.loads(await ws.recv())
        if frame["type"] == "error":
            raise RuntimeError(frame)
        num -= frame["type"] == "value"


async def one_run(backend: Backend, criteria: str, args: argparse.Namespace) -> float:
    """Seconds from the map-reduce's submit to its value, under background load."""
    config = ServerConfig(port=0, max_inflight=args.max_inflight)
    async with await start_server(config, backend, owns_backend=False) as server:
        background = await open_session(server.url)
        user = await open_session(server.url)
        await background.send(json.dumps(background_frame(args.background, args.max_tokens)))
        await asyncio.sleep(0.05)  # the background work is queued first
        started = time.perf_counter()
        await user.send(json.dumps(map_reduce_frame(criteria, args.max_tokens)))
        await until_values(user, 1)
        elapsed = time.perf_counter() - started
        await until_values(background, args.background)
        await user.close()
        await background.close()
    return elapsed


async def main(args: argparse.Namespace) -> None:
    backend = await asyncio.to_thread(build_backend, args.model)
    await backend.start()
    try:
        await one_run(backend, "latency", args)  # warm-up: first-call costs off the clock
        results = {c: await one_run(backend, c, args) for c in ("throughput", "latency")}
    finally:
        await backend.shutdown()
    print(
        f"model {args.model}, max_inflight {args.max_inflight}, background "
        f"{args.background} calls x {args.max_tokens} tokens"
    )
    for criteria, seconds in results.items():
        print(f"map-reduce get with criteria={criteria:10}  {seconds:7.3f} s")
    print(f"latency-criteria speed-up: {results['throughput'] / results['latency']:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--background", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-inflight", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
