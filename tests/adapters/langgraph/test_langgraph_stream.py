"""stream/astream yield step by step: a step's chunks arrive while later steps still run
(here, a later Python node waits until the consumer has seen the first node's chunk: an
all-at-the-end stream would make it time out), and the chunks are the eager stream's."""

from __future__ import annotations

import threading
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from lg_graphs import text

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import compile
from eclectus.server.front.app import EclectusServer

WAIT_S = 20.0


class Waiting(TypedDict, total=False):
    topic: str
    draft: str
    saw_draft: bool


def waiting_app(model: ChatEclectus, seen: threading.Event) -> Any:
    """write (LCEL) -> wait (Python: blocks until the consumer saw write's chunk)."""

    def wait(state: Waiting) -> dict[str, bool]:
        return {"saw_draft": seen.wait(WAIT_S)}

    builder = StateGraph(Waiting)
    builder.add_node("write", {"draft": text(model, "Write about {topic}:")})
    builder.add_node("wait", wait)
    builder.add_edge(START, "write")
    builder.add_edge("write", "wait")
    builder.add_edge("wait", END)
    return builder.compile()


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


def consume(chunks: Any, seen: threading.Event) -> list[Any]:
    out = []
    for chunk in chunks:
        out.append(chunk)
        if "write" in chunk:
            seen.set()
    return out


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "eager"])
def test_stream_yields_each_step_as_it_is_known(chat: ChatEclectus, compiled: bool) -> None:
    """updates: write's chunk comes before the run ends, as LangGraph's own stream."""
    seen = threading.Event()
    app = waiting_app(chat, seen)
    runner = compile(app) if compiled else app
    chunks = consume(runner.stream({"topic": "owls"}, stream_mode="updates"), seen)
    assert chunks[-1] == {"wait": {"saw_draft": True}}
    assert [next(iter(c)) for c in chunks] == ["write", "wait"]


async def test_astream_yields_each_step_as_it_is_known(chat: ChatEclectus) -> None:
    """The async twin, in values mode: the state after each step, the eager stream's."""
    seen = threading.Event()
    app = waiting_app(chat, seen)
    chunks = []
    async for chunk in compile(app).astream({"topic": "owls"}, stream_mode="values"):
        chunks.append(chunk)
        if "draft" in chunk:
            seen.set()
    assert chunks[-1]["saw_draft"] is True
    seen.clear()
    eager = [c async for c in app.astream({"topic": "owls"}, stream_mode="values")]
    assert [set(c) for c in chunks] == [set(c) for c in eager[: len(chunks)]]
    assert chunks[1] == eager[1]


def test_closing_a_stream_early_stops_the_run(chat: ChatEclectus) -> None:
    """Breaking out after the first chunk returns promptly and leaves nothing running."""
    seen = threading.Event()
    seen.set()
    stream = compile(waiting_app(chat, seen)).stream({"topic": "owls"}, stream_mode="updates")
    first = next(iter(stream))
    stream.close()
    assert "write" in first
