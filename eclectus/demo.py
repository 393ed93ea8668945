"""``eclectus demo``: a map-reduce graph on a local in-process server, and what it saw.

Starts the server on a free port with the chosen model (``tiny`` by default), sends 4 map
calls and 1 reduce through the SDK as one graph (one submit frame, one value back), then the
same calls one by one as a completion API client would, and prints both results, wall
times, and the server's counters read back from its own /metrics page.

The comparison is like for like: an untimed warm-up run first pays the one-time costs (the
CPU kernel's compile, first allocations), and each mode runs as its own tenant, so neither
reuses the prefix cache the other filled (tenants never share KV).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request

from eclectus.models.presets import PRESET_NOTES
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, start_server
from eclectus.server.front.metrics import parse_prometheus

DOCS = (
    "The Parrot paper describes serving LLM applications as graphs of semantic variables.",
    "Shared prompt prefixes let the engine compute the key-value cache once for many calls.",
    "Scheduling by end-to-end objective lets a latency-critical reduce go before bulk work.",
    "An application that makes several dependent calls pays a round trip for each one.",
)
SYSTEM = "You are a concise assistant who summarizes technical notes in one sentence.\n"
MAP = SYSTEM + "Note:\n{{doc}}\nSummary:{{summary}}"
REDUCE = SYSTEM + "Combine these summaries:\n{{a}}\n{{b}}\n{{c}}\n{{d}}\nFinal:{{final}}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags (mutates ``parser``)."""
    parser.add_argument("--model", default="tiny", help="'tiny' or a HF checkpoint directory")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per map output")


def scrape(server: EclectusServer) -> dict[str, float]:
    """The server's /metrics page over HTTP, parsed (blocking: run in a thread)."""
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as response:
        return parse_prometheus(response.read().decode())


# each mode is its own authenticated tenant, so neither reads the prefix cache the other filled
TOKENS = {name: f"{name}-token" for name in ("demo-warm-up", "demo-graph", "demo-one-by-one")}


async def run_graph(
    server: EclectusServer, max_tokens: int, tenant: str = "demo-graph"
) -> tuple[str, int]:
    """The map-reduce as one graph; returns the final text and the graph's call depth."""
    from eclectus.adapters.client import connect

    async with connect(server.url, app=tenant, token=TOKENS[tenant]) as app:
        summarize = app.function(MAP, summary=dict(max_tokens=max_tokens))
        combine = app.function(REDUCE, final=dict(max_tokens=2 * max_tokens))
        sums = [summarize(doc=doc) for doc in DOCS]
        final = combine(a=sums[0], b=sums[1], c=sums[2], d=sums[3])
        text = await final.aget(criteria="latency")
        depth = max(s.graph_depth for s in server.scheduler.snapshot() if s.tenant == tenant)
    return text, depth


async def run_one_by_one(server: EclectusServer, max_tokens: int) -> str:
    """The same calls with a client round trip after each, as with a completion API."""
    from eclectus.adapters.client import connect

    tenant = "demo-one-by-one"
    async with connect(server.url, app=tenant, token=TOKENS[tenant]) as app:
        summarize = app.function(MAP, summary=dict(max_tokens=max_tokens))
        combine = app.function(REDUCE, final=dict(max_tokens=2 * max_tokens))
        sums = [await summarize(doc=doc).aget() for doc in DOCS]
        return await combine(a=sums[0], b=sums[1], c=sums[2], d=sums[3]).aget()


def delta(after: dict[str, float], before: dict[str, float], name: str) -> int:
    return int(after.get(name, 0) - before.get(name, 0))


def readable(text: str, limit: int = 160) -> str:
    """``text`` on one line, cut at ``limit`` characters; quoted with escapes when it holds
    characters a terminal would not show (the random ``small`` model's bytes) (pure)."""
    line = " ".join(text.split())
    line = line if len(line) <= limit else line[: limit - 1] + "…"
    return line if line.isprintable() else repr(line)


async def demo(model: str, max_tokens: int) -> int:
    config = ServerConfig(port=0, model=model, tenant_tokens=tuple(TOKENS.items()))
    async with await start_server(config) as server:
        print(f"server: {server.url}  model: {server.model.name}")
        print("warming up (one untimed run: kernel compile, first allocations)...")
        await run_graph(server, max_tokens, tenant="demo-warm-up")
        before = await asyncio.to_thread(scrape, server)
        started = time.perf_counter()
        graph_text, depth = await run_graph(server, max_tokens)
        graph_s = time.perf_counter() - started
        middle = await asyncio.to_thread(scrape, server)
        started = time.perf_counter()
        serial_text = await run_one_by_one(server, max_tokens)
        serial_s = time.perf_counter() - started
        after = await asyncio.to_thread(scrape, server)
    if model in PRESET_NOTES:
        print(f"\n({PRESET_NOTES[model]}; --model PATH serves a real checkpoint)")
    print(f"\nfinal (graph):      {readable(graph_text)}")
    print(f"final (one by one): {readable(serial_text)}")
    print(f"same text: {graph_text == serial_text}\n")
    rows = [
        ("wall time (s)", f"{graph_s:.3f}", f"{serial_s:.3f}"),
        ("graph depth (calls)", str(depth), "-"),
    ]
    for label, name in [
        ("engine calls", "eclectus_calls_finished_total"),
        ("client frames received", "eclectus_client_frames_total"),
        ("values sent to client", "eclectus_values_sent_total"),
        ("prompt tokens", "eclectus_prompt_tokens_total"),
        ("prefix-cache hit tokens", "eclectus_prefix_cache_hit_tokens_total"),
        ("tokens generated", "eclectus_generated_tokens_total"),
        # the graph's maps decode in one batch, one by one they take turns: fewer steps
        ("engine steps", "eclectus_engine_num_steps"),
    ]:
        rows.append((label, str(delta(middle, before, name)), str(delta(after, middle, name))))
    print(f"{'what the server saw':26} {'graph':>10} {'one by one':>12}")
    for label, graph_value, serial_value in rows:
        print(f"{label:26} {graph_value:>10} {serial_value:>12}")
    print(
        "\n(after an untimed warm-up; each mode runs as its own tenant, so neither reuses the"
        " other's prefix cache)"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(demo(args.model, args.max_tokens))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
