"""Frame economy and round trips: a map-reduce as one graph vs. the same calls one by one.

    python -m eclectus.benchmarks.client [--url ws://host:port] [--docs 8] [--max-tokens 16]

Without ``--url`` it starts the built-in server with the ``tiny`` model in this process (that
path imports the server, hence torch; the SDK itself never does). Both modes run the same
calls with greedy sampling, so the final texts must match; the graph mode sends one submit
where the step-by-step mode pays a round trip per call. Prints frames and wall time for each
and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from eclectus.adapters.client.connect import connect
from eclectus.benchmarks.server import server_url

MAP = "Summarize:\n{{doc}}\nSummary:{{summary}}"
REDUCE = "Combine the summaries:\n{{all}}\nFinal:{{final}}"


@dataclass(frozen=True, slots=True)
class Run:
    final: str
    num_frames: int  # client frames after hello
    seconds: float


def documents(num_docs: int) -> list[str]:
    """Deterministic, distinct documents sharing a long common preamble (pure)."""
    preamble = "This is a report from the field office. " * 4
    return [f"{preamble}Item {i}: observed {i * 7 % 13} events." for i in range(num_docs)]


async def as_graph(url: str, token: str | None, docs: list[str], max_tokens: int) -> Run:
    """All map calls, the join and the reduce in one fragment; one get."""
    async with connect(url, token=token, app="bench-graph") as app:
        start = time.perf_counter()
        summarize = app.function(MAP, summary=dict(max_tokens=max_tokens))
        combine = app.function(REDUCE, final=dict(max_tokens=max_tokens))
        summaries = [summarize(doc=d) for d in docs]
        joined = app.join([s for s in summaries if not isinstance(s, tuple)], sep="\n")
        final = combine(all=joined)
        assert not isinstance(final, tuple)
        text = await final.aget("latency")
        return Run(text, app.num_frames_sent, time.perf_counter() - start)


async def step_by_step(url: str, token: str | None, docs: list[str], max_tokens: int) -> Run:
    """What a completion API forces: each call a request, its text back to the client."""
    async with connect(url, token=token, app="bench-steps") as app:
        start = time.perf_counter()
        summarize = app.function(MAP, summary=dict(max_tokens=max_tokens))
        combine = app.function(REDUCE, final=dict(max_tokens=max_tokens))
        texts = []
        for doc in docs:
            summary = summarize(doc=doc)
            assert not isinstance(summary, tuple)
            texts.append(await summary.aget("latency"))
        final = combine(all="\n".join(texts))
        assert not isinstance(final, tuple)
        text = await final.aget("latency")
        return Run(text, app.num_frames_sent, time.perf_counter() - start)


async def compare(url: str, token: str | None, num_docs: int, max_tokens: int) -> None:
    docs = documents(num_docs)
    await as_graph(url, token, docs[:1], max_tokens)  # warm-up: first-call costs aside
    steps = await step_by_step(url, token, docs, max_tokens)
    graph = await as_graph(url, token, docs, max_tokens)
    assert graph.final == steps.final, "graph and step-by-step results differ"
    print(f"map-reduce over {num_docs} docs, {max_tokens} tokens per call")
    print(f"  step by step : {steps.num_frames:4d} frames  {steps.seconds * 1e3:8.1f} ms")
    print(f"  one graph    : {graph.num_frames:4d} frames  {graph.seconds * 1e3:8.1f} ms")
    print(
        f"  ratio        : {steps.num_frames / graph.num_frames:4.1f}x fewer frames, "
        f"{steps.seconds / graph.seconds:.2f}x faster"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (default: start tiny)")
    parser.add_argument("--token", default=None)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    with server_url(args.url, args.token) as url:
        asyncio.run(compare(url, args.token, args.docs, args.max_tokens))


if __name__ == "__main__":
    main()
