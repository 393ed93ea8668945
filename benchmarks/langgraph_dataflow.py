"""Beyond the eager run: branches of unequal length, compiled (dataflow) vs eager LangGraph.

    python -m eclectus.benchmarks.langgraph_dataflow [--url ws://host:port] [--rounds 5]

LangGraph runs supersteps: a node runs when every task of the step before it is done, so
the successor of a short branch waits for its slow sibling (langgraph-ai/langgraph issues
3617 and 6320). Compiled, the graph runs as dataflow on the server: ``follow`` starts when
``short`` is done. The graph (:func:`unequal_branches`) is START -> long -> END and START
-> short -> follow -> END, every node a Python function calling the model, greedy, each
call generating exactly its tokens. Eager takes about long + follow, compiled about
max(long, short + follow), with the same results. Rounds alternate eager and compiled; the
report gives each one's median, min and max, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph.compiled import compile
from eclectus.benchmarks.server import server_url


class Branches(TypedDict, total=False):
    topic: str
    long: str
    short: str
    follow: str


def unequal_branches(
    long_tokens: int = 192, short_tokens: int = 4, follow_tokens: int = 180
) -> tuple[Any, dict[str, Any]]:
    """The graph and its input; models from ``ECLECTUS_URL`` (pure: connects on use)."""

    def model(tokens: int) -> ChatEclectus:
        return ChatEclectus(max_tokens=tokens, temperature=0, model_kwargs={"ignore_eos": True})

    long_llm, short_llm, follow_llm = model(long_tokens), model(short_tokens), model(follow_tokens)

    def long(state: Branches) -> dict[str, str]:
        return {"long": long_llm.invoke(f"Tell the whole story of {state['topic']}:\n").content}

    def short(state: Branches) -> dict[str, str]:
        return {"short": short_llm.invoke(f"One word for {state['topic']}:\n").content}

    def follow(state: Branches) -> dict[str, str]:
        return {"follow": follow_llm.invoke(f"Write about this word:\n{state['short']}").content}

    builder = StateGraph(Branches)
    builder.add_node("long", long)
    builder.add_node("short", short)
    builder.add_node("follow", follow)
    builder.add_edge(START, "long")
    builder.add_edge(START, "short")
    builder.add_edge("short", "follow")
    builder.add_edge("long", END)
    builder.add_edge("follow", END)
    return builder.compile(), {"topic": "the harbor"}


def measure(rounds: int) -> dict[str, list[float]]:
    """Seconds per run of each form, rounds alternating (the first one of each unmeasured:
    sessions open, prompts cached alike)."""
    app, value = unequal_branches()
    fast = compile(app)
    if fast.invoke(value) != app.invoke(value):
        raise SystemExit("compiled and eager results differ")
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for name, run in (("eager", app.invoke), ("compiled", fast.invoke)):
            start = time.perf_counter()
            run(value)
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with server_url(args.url) as url:
        os.environ["ECLECTUS_URL"] = url
        times = measure(args.rounds)
    for name, values in times.items():
        print(
            f"{name:9s} median {statistics.median(values):.3f} s  "
            f"min {min(values):.3f}  max {max(values):.3f}  ({len(values)} runs)"
        )
    ratio = statistics.median(times["eager"]) / statistics.median(times["compiled"])
    print(f"compiled is {ratio:.2f}x faster (median over median)")


if __name__ == "__main__":
    main()
