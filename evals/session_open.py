"""``python -m eclectus.evals.session_open``: what opening a session costs over a slow link.

A server (the built-in engine, `tiny`) behind the evals' delay proxy (proxy.py: ``--rtt-ms``
of added round trip, and one more for each new connection's TCP handshake, as on a real
network). Alternating over ``--rounds``, it times from nothing to the ``welcome`` frame:

- **one round trip** (the SDK's ``connect``): the ``hello`` rides on the WebSocket upgrade
  (``Eclectus-Hello``), and the welcome comes right after it;
- **two round trips** (the old way, which servers still take): the upgrade, then ``hello``
  as the first frame.

and prints each time and the medians (the TCP handshake is in both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from websockets.asyncio.client import connect as ws_connect

from eclectus.adapters.client import connect
from eclectus.evals.proxy import DelayProxy
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import serve_in_thread


async def one_round_trip(url: str) -> float:
    started = time.perf_counter()
    session = await connect(url)
    elapsed = time.perf_counter() - started
    await session.aclose()
    return elapsed


async def two_round_trips(url: str) -> float:
    started = time.perf_counter()
    async with ws_connect(url) as ws:
        await ws.send(json.dumps({"type": "hello", "id": "h", "protocol": 1}))
        welcome = json.loads(await ws.recv())
        elapsed = time.perf_counter() - started
        assert welcome["type"] == "welcome", welcome
    return elapsed


async def measure(url: str, rounds: int) -> dict[str, list[float]]:
    one, two = "one round trip (hello on the upgrade)", "two round trips (hello as a frame)"
    times: dict[str, list[float]] = {one: [], two: []}
    for _ in range(rounds):
        times[one].append(await one_round_trip(url))
        times[two].append(await two_round_trips(url))
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eclectus.evals.session_open")
    parser.add_argument("--rtt-ms", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with (
        serve_in_thread(ServerConfig(port=0)) as server,
        DelayProxy("127.0.0.1", server.port, rtt_s=args.rtt_ms / 1000) as proxy,
    ):
        times = asyncio.run(measure(f"ws://127.0.0.1:{proxy.port}", args.rounds))
    for name, values in times.items():
        shown = ", ".join(f"{1000 * v:.0f}" for v in values)
        median = 1000 * statistics.median(values)
        print(f"{name}: median {median:.0f} ms to welcome (runs: {shown} ms)")


if __name__ == "__main__":
    main()
