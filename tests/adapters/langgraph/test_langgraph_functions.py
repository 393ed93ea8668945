"""LangGraph apps written as its tutorials write them, Python function nodes calling the
model, compiled: the same state as eager LangGraph, one client frame per run plus one per
Python decision on model output, side effects once and in order, every break named by
``explain()``; and a graph whose branches differ in length finishing sooner compiled
(dataflow, no superstep barrier) with the same results."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import lg_tutorials
import pytest
from langchain_core.messages import BaseMessage
from langgraph.graph import END, START, StateGraph
from lg_graphs import run_compiled

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import compile
from eclectus.benchmarks.langgraph_dataflow import unequal_branches
from eclectus.server.front.app import EclectusServer

EVENTS: list[Any] = []


@pytest.fixture
def llm(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=8, temperature=0, model_kwargs={"ignore_eos": True})


def plain(value: Any) -> Any:
    """States compared by what they say: a message by its type, content and name."""
    if isinstance(value, BaseMessage):
        return (value.type, value.content, value.name)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@pytest.mark.parametrize("name", sorted(lg_tutorials.TUTORIALS))
def test_tutorial_apps_compile_to_their_eager_state(llm: ChatEclectus, name: str) -> None:
    app, value, frames = lg_tutorials.TUTORIALS[name](llm)
    eager = app.invoke(value)
    fast, out = run_compiled(app, value)
    assert plain(out) == plain(eager)
    trace = fast.last_graph
    assert trace is not None and not trace.cuts, fast.explain()
    if name == "prompt_chaining":  # the gate passed: no improve step, one frame in all
        frames = 2 if "improved_joke" in out else 1
    if name == "supervisor":  # per turn: the decision, and the worker's named message
        frames = len(trace.breaks)  # (the last decision's fetch leaves nothing to fetch)
    assert fast.last_frames == frames, fast.explain()


@pytest.mark.parametrize("width", [3, 12])
def test_a_send_fan_out_of_function_nodes_is_one_frame_at_any_width(
    llm: ChatEclectus, width: int
) -> None:
    """The issue's map-reduce (Python nodes calling LCEL chains): 1 frame at 3 and at 12,
    where eager LangGraph sends one request per call."""
    app, value, _ = lg_tutorials.map_reduce_chains(llm, width)
    fast = compile(app)
    assert fast.invoke(value) == app.invoke(value)
    assert fast.last_frames == 1
    assert fast.last_graph is not None and fast.last_graph.num_calls == width + 1


async def test_async_function_nodes(llm: ChatEclectus) -> None:
    app, value, frames = lg_tutorials.parallelization(llm)
    fast = compile(app)
    assert plain(await fast.ainvoke(value)) == plain(await app.ainvoke(value))
    assert fast.last_frames == frames


def test_explain_names_function_nodes_and_their_breaks(llm: ChatEclectus) -> None:
    app, value, _ = lg_tutorials.map_reduce(llm)
    fast = compile(app)
    fast.invoke(value)
    text = fast.explain()
    assert "generate_joke: server (a Python function, evaluated" in text
    assert "BREAK  map_reduce.<locals>.continue_to_jokes line" in text
    assert "iterating a server value of unknown length" in text
    assert "1 break(s)" in text and "last run: 2 client frame(s)" in text


class Noted(TypedDict, total=False):
    topic: str
    draft: str
    notes: Annotated[list[str], operator.add]
    final: str


def noting_graph(llm: ChatEclectus) -> Any:
    """Side effects in nodes: a print, an append to the app's list, a note per Send."""

    def write(state: Noted) -> dict[str, str]:
        EVENTS.append(("write", state["topic"]))
        draft = llm.invoke(f"Write about {state['topic']}:\n").content
        print("drafted", len(draft))  # len() of the draft: a break
        return {"draft": draft}

    def review(state: Noted) -> dict[str, list[str]]:
        EVENTS.append("review")
        reply = llm.invoke(f"Review:\n{state['draft']}").content
        EVENTS.append(reply)  # the app's own list gets the text
        return {"notes": [reply.strip()]}

    def finish(state: Noted) -> dict[str, str]:
        EVENTS.append(("finish", len(state["notes"])))
        return {"final": " / ".join(state["notes"])}

    builder = StateGraph(Noted)
    builder.add_node("write", write)
    builder.add_node("review", review)
    builder.add_node("finish", finish)
    builder.add_edge(START, "write")
    builder.add_edge("write", "review")
    builder.add_edge("review", "finish")
    builder.add_edge("finish", END)
    return builder.compile()


def test_side_effects_in_nodes_run_once_in_order(
    llm: ChatEclectus, capsys: pytest.CaptureFixture
) -> None:
    app = noting_graph(llm)
    EVENTS.clear()
    eager = app.invoke({"topic": "kelp"})
    eager_events, eager_out = list(EVENTS), capsys.readouterr().out
    EVENTS.clear()
    fast = compile(app)
    assert fast.invoke({"topic": "kelp"}) == eager
    assert eager_events == EVENTS and capsys.readouterr().out == eager_out
    trace = fast.last_graph
    assert trace is not None and [why for _, why in trace.breaks] == [
        "len() of a server value",
        "calling list.append with a server value",
    ]
    assert fast.last_frames == 2  # the two breaks; the final state was known by then


def test_a_function_node_the_evaluator_cannot_run_is_a_client_cut(llm: ChatEclectus) -> None:
    """A ``try`` in a node: the node runs as Python over the fetched state, once."""

    def guarded(state: Noted) -> dict[str, str]:
        EVENTS.append("guarded")
        try:
            return {"final": state["draft"].title()}
        except AttributeError:
            return {"final": ""}

    builder = StateGraph(Noted)
    builder.add_node("write", lambda s: {"draft": llm.invoke(f"On {s['topic']}:\n").content})
    builder.add_node("guarded", guarded)
    builder.add_edge(START, "write")
    builder.add_edge("write", "guarded")
    builder.add_edge("guarded", END)
    app = builder.compile()
    eager = app.invoke({"topic": "salt"})
    EVENTS.clear()
    fast = compile(app)
    assert fast.invoke({"topic": "salt"}) == eager and EVENTS == ["guarded"]
    assert fast.last_graph is not None and [n for n, _ in fast.last_graph.cuts] == ["guarded"]
    assert "a try statement" in fast.explain()
    assert fast.last_frames == 1  # the cut's fetch; the final state is known then


def test_beyond_the_eager_run_unequal_branches_finish_sooner(
    eclectus_server: EclectusServer,
) -> None:
    """A short branch's successor starts when the short branch is done, not at the end of
    the superstep. Counted in engine steps (one token per running call each), not seconds:
    eager, ``follow`` waits for ``long``, so the run takes at least long + follow steps;
    compiled, the two overlap, so it takes fewer. Same results. (The wall-time gain is the
    benchmark's: python -m eclectus.benchmarks.langgraph_dataflow.)"""
    long_tokens, follow_tokens = 96, 90
    app, value = unequal_branches(long_tokens, short_tokens=2, follow_tokens=follow_tokens)
    fast = compile(app)
    assert fast.invoke(value) == app.invoke(value)  # and sessions open, prompts cached alike

    def steps_of(run: Any) -> int:
        before = eclectus_server.backend.stats().extra["num_steps"]
        run(value)
        return int(eclectus_server.backend.stats().extra["num_steps"] - before)

    eager_steps, compiled_steps = steps_of(app.invoke), steps_of(fast.invoke)
    assert eager_steps >= long_tokens + follow_tokens, eager_steps
    assert compiled_steps < long_tokens + follow_tokens, (compiled_steps, eager_steps)
