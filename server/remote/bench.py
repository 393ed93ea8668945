"""``python -m eclectus.server.remote.bench``: what graph-aware routing buys over a fleet.

Starts ``--engines`` engines (``eclectus serve --model tiny`` processes serving the
OpenAI-compatible API, one torch thread each) and, in this process, the graph server in front
of them with the remote backend. One application asks ``--questions`` questions about each of
``--docs`` documents (every prompt starts with its document's segment), all in one submit,
with ``--max-inflight`` calls in flight at once so later questions are still queued when the
first about a document is dispatched (the scheduler pins the document's prefix). Each routing
policy runs on fresh document texts (so no run profits from another's cache), and the
prompt tokens the engines served from their prefix caches (from each stream's ``usage``), the
wall time and the routing decisions are printed.
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

from websockets.asyncio.client import connect

from eclectus.server.app import start_server
from eclectus.server.config import ServerConfig
from eclectus.server.remote import RemoteConfig, RoutingPolicy, build_remote_backend


def document_frame(tag: str, num_docs: int, num_questions: int) -> dict[str, Any]:
    """One submit: questions over documents, every answer got (pure)."""
    frame: dict[str, Any] = {"type": "submit", "vars": [], "calls": [], "gets": []}
    for d in range(num_docs):
        text = f"Document {tag}-{d}. " + f"Paragraph {d} says something specific. " * 30
        frame["vars"].append({"id": f"doc{d}", "value": text})
        for q in range(num_questions):
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


def start_engine() -> tuple[subprocess.Popen[str], str]:
    """An engine process and its OpenAI base URL (blocks until it listens)."""
    command = [sys.executable, "-m", "eclectus", "serve", "--model", "tiny", "--port", "0"]
    command += ["--num-threads", "1", "--num-kv-blocks", "1024"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        match = re.search(r"OpenAI API: (http://\S+/v1)\)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError("engine did not start")


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
            await ws.send(json.dumps(frame))
            pending = len(frame["gets"])
            while pending:
                got = json.loads(await ws.recv())
                if got["type"] == "error":
                    raise RuntimeError(got)
                pending -= got["type"] == "value"
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
    parser = argparse.ArgumentParser(prog="python -m eclectus.server.remote.bench")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--max-inflight", type=int, default=4)
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
