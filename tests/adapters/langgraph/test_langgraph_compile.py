"""Differential tests of ``eclectus.adapters.langgraph.compile``: for LangGraph's doc shapes,
the compiled graph and the app run eagerly, on one tiny model with greedy decoding, give the
same state, the same ``values``/``updates`` streams, and the compiled run sends few frames:
one per client cut plus one, whatever the fan-out width."""

from __future__ import annotations

from typing import Any

import lg_graphs
import pytest
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.memory import InMemorySaver

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import EagerFallbackWarning, compile
from eclectus.server.front.app import EclectusServer

SHAPES = ["sequential", "python_in_the_middle", "map_reduce", "plan_execute", "supervisor"]


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


def plain(value: Any) -> Any:
    """States compared by what they say: a message by its type and content."""
    if isinstance(value, BaseMessage):
        return (value.type, value.content)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@pytest.mark.parametrize("shape", [*SHAPES, "chat_agent"])
def test_compiled_equals_eager(chat: ChatEclectus, shape: str) -> None:
    """invoke: the compiled graph's output state is the eager app's."""
    app, value = getattr(lg_graphs, shape)(chat)
    compiled, out = lg_graphs.run_compiled(app, value)
    assert plain(out) == plain(app.invoke(value))
    assert compiled.last_graph is not None and compiled.last_graph.num_calls >= 2


@pytest.mark.parametrize(
    ("shape", "frames"),
    [("sequential", 1), ("python_in_the_middle", 1), ("map_reduce", 1), ("plan_execute", 2)],
)
def test_frames_per_run(chat: ChatEclectus, shape: str, frames: int) -> None:
    """One frame per decision on server values, plus the final one: the Python node's
    ``.upper()`` of a reply is a server op (evaluated, no round trip); the planner's text
    split into steps is a decision."""
    compiled = compile(getattr(lg_graphs, shape)(chat)[0])
    compiled.invoke(getattr(lg_graphs, shape)(chat)[1])
    assert compiled.last_frames == frames, compiled.explain()


@pytest.mark.parametrize("width", [2, 8])
def test_fan_out_costs_no_frames(chat: ChatEclectus, width: int) -> None:
    """A Send fan-out of any width ships in the same single frame."""
    app, value = lg_graphs.map_reduce(chat, width)
    compiled = compile(app)
    out = compiled.invoke(value)
    assert len(out["jokes"]) == width
    assert compiled.last_frames == 1
    assert compiled.last_graph is not None and compiled.last_graph.num_calls == width + 1


async def test_ainvoke_and_abatch(chat: ChatEclectus) -> None:
    """The async surface gives the eager results too."""
    app, value = lg_graphs.supervisor(chat)
    compiled = compile(app)
    eager = await app.ainvoke(value)
    assert plain(await compiled.ainvoke(value)) == plain(eager)
    other = {"task": "a tunnel", "log": []}
    assert plain(await compiled.abatch([value, other])) == plain(await app.abatch([value, other]))


@pytest.mark.parametrize("mode", ["values", "updates", ["updates", "values"]])
@pytest.mark.parametrize("shape", ["python_in_the_middle", "map_reduce"])
def test_stream_modes(chat: ChatEclectus, shape: str, mode: Any) -> None:
    """stream(stream_mode=values/updates/both) yields what the eager stream yields."""
    app, value = getattr(lg_graphs, shape)(chat)
    eager = plain(list(app.stream(value, stream_mode=mode)))
    compiled = plain(list(compile(app).stream(value, stream_mode=mode)))
    if shape == "map_reduce" and mode != "values":  # Send tasks finish in any order eagerly
        eager, compiled = sorted(map(repr, eager)), sorted(map(repr, compiled))
    assert compiled == eager


def test_a_checkpointer_falls_back_to_eager(chat: ChatEclectus) -> None:
    """A graph with a checkpointer runs on LangGraph itself, with a warning, same result."""
    app, value = lg_graphs.sequential(chat)
    saved = app.builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    compiled = compile(saved)
    assert "checkpointer" in compiled.explain()
    with pytest.warns(EagerFallbackWarning, match="checkpointer"):
        out = compiled.invoke(value, config)
    assert out == app.invoke(value)
    assert saved.get_state(config).values["final"] == out["final"]


def test_an_unsupported_stream_mode_falls_back(chat: ChatEclectus) -> None:
    """stream_mode='debug' is LangGraph's: eager, with a warning."""
    app, value = lg_graphs.sequential(chat)
    with pytest.warns(EagerFallbackWarning, match="debug"):
        chunks = list(compile(app).stream(value, stream_mode="debug"))
    assert chunks and all(isinstance(c, dict) for c in chunks)


def test_explain_names_server_nodes_and_cuts(chat: ChatEclectus) -> None:
    """explain(): LCEL nodes on the server, Python nodes and routers evaluated."""
    app, value = lg_graphs.map_reduce(chat)
    compiled = compile(app)
    compiled.invoke(value)
    text = compiled.explain()
    assert "joke: server" in text and "subjects: server (a Python function, evaluated" in text
    assert "subjects -> ? (fan_out): evaluated" in text
    assert "last run: 1 client frame(s)" in text


def test_recursion_limit(chat: ChatEclectus) -> None:
    """A loop over the limit raises LangGraph's GraphRecursionError, as eager does."""
    from langgraph.errors import GraphRecursionError

    app, value = lg_graphs.supervisor(chat, rounds=50)
    with pytest.raises(GraphRecursionError):
        compile(app).invoke(value, {"recursion_limit": 4})
    with pytest.raises(GraphRecursionError):
        app.invoke(value, {"recursion_limit": 4})


def test_output_schema_and_empty_updates(chat: ChatEclectus) -> None:
    """An output schema narrows invoke, values and updates; a node writing nothing streams
    ``{node: None}``, as LangGraph does."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class Out(TypedDict):
        final: str

    def idle(state: lg_graphs.Pipeline) -> dict[str, str]:
        return {}

    builder = StateGraph(lg_graphs.Pipeline, output_schema=Out)
    builder.add_node("write", {"draft": lg_graphs.text(chat, "On {topic}:")})
    builder.add_node("idle", idle)
    builder.add_node("refine", {"final": lg_graphs.text(chat, "Better: {draft}")})
    builder.add_edge(START, "write")
    builder.add_edge("write", "idle")
    builder.add_edge("idle", "refine")
    builder.add_edge("refine", END)
    app, value = builder.compile(), {"topic": "rain"}
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    for mode in ("values", "updates"):
        eager = list(app.stream(value, stream_mode=mode))
        assert list(compiled.stream(value, stream_mode=mode)) == eager


def test_a_node_that_takes_the_runtime_falls_back(chat: ChatEclectus) -> None:
    """A node asking LangGraph to inject its writer/store/runtime runs eagerly."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import StreamWriter

    def note(state: lg_graphs.Pipeline, writer: StreamWriter) -> dict[str, str]:
        writer({"seen": state["topic"]})
        return {"loud": state["topic"].upper()}

    builder = StateGraph(lg_graphs.Pipeline)
    builder.add_node("note", note)
    builder.add_edge(START, "note")
    builder.add_edge("note", END)
    app = builder.compile()
    compiled = compile(app)
    assert "['writer']" in compiled.explain()
    with pytest.warns(EagerFallbackWarning, match="writer"):
        assert compiled.invoke({"topic": "x"}) == {"topic": "x", "loud": "X"}


def test_run_keyword_arguments_fall_back(chat: ChatEclectus) -> None:
    """invoke(..., stream_mode="updates") returns LangGraph's chunks: eager, with a warning."""
    app, value = lg_graphs.sequential(chat)
    with pytest.warns(EagerFallbackWarning, match="stream_mode"):
        chunks = compile(app).invoke(value, stream_mode="updates")
    assert plain(chunks) == plain(app.invoke(value, stream_mode="updates"))


def test_the_default_recursion_limit_is_langgraphs(chat: ChatEclectus) -> None:
    """Without a recursion_limit, a loop of more than LangChain's 25 steps runs as eagerly."""
    app, value = lg_graphs.supervisor(chat, rounds=13)  # 27 supersteps
    assert plain(compile(app).invoke(value)) == plain(app.invoke(value))


def test_a_python_node_returning_command(chat: ChatEclectus) -> None:
    """Command(update=..., goto=...) from a Python node routes and updates as eagerly."""
    from typing import Literal

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command

    def decide(state: lg_graphs.Pipeline) -> Command[Literal["refine"]]:
        return Command(update={"loud": state["draft"][:2]}, goto="refine")

    builder = StateGraph(lg_graphs.Pipeline)
    builder.add_node("write", {"draft": lg_graphs.text(chat, "On {topic}:")})
    builder.add_node("decide", decide)
    builder.add_node("refine", {"final": lg_graphs.text(chat, "{loud} then {draft}")})
    builder.add_edge(START, "write")
    builder.add_edge("write", "decide")
    builder.add_edge("refine", END)
    app, value = builder.compile(), {"topic": "snow"}
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    updates = list(compiled.stream(value, stream_mode="updates"))
    assert updates == list(app.stream(value, stream_mode="updates"))
