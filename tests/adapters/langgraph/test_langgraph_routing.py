"""Routing on the server: a LangGraph router over a constrained ``choice`` compiles to a
protocol switch. Compiled == eager (tiny model, greedy), one client frame per run instead
of two, the branches not taken never reach the engine, and anything the router cannot be
evaluated ahead of time for falls back to the client cut, exactly."""

from __future__ import annotations

from typing import Any

import lg_graphs
import pytest
from langgraph.graph import END
from test_langgraph_callbacks import counted

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import compile
from eclectus.server.front.app import EclectusServer

# orders of the three literals: greedy on the tiny model picks one per order and task,
# so together they take every branch (each literal is the first choice once)
ORDERS = [lg_graphs.PICKS, ("write", "FINISH", "research"), ("FINISH", "research", "write")]
TASKS = ["a bridge", "owls", "tidy the shed"]


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


def calls_submitted(server: EclectusServer) -> int:
    return server.metrics.calls_submitted


def assert_routed_on_server(
    app: Any, value: dict[str, Any], server: EclectusServer, routes: tuple[str, ...]
) -> None:
    """Compiled ``app`` equals the eager run in one frame, and the server ran only the taken
    branch: router + worker + review, or the router alone when ``routes[2]`` (the end) is
    taken; the trace declares all five calls (router, 2 workers, 2 reviews), no cut."""
    compiled = compile(app)
    before = calls_submitted(server)
    out = compiled.invoke(value)
    ran = calls_submitted(server) - before
    assert out == app.invoke(value)
    assert out["next"] in routes
    assert compiled.last_frames == 1, compiled.explain()
    assert ran == (1 if out["next"] == routes[2] else 3)
    trace = compiled.last_graph
    assert trace is not None and "switch on 'next'" in trace.render()
    assert trace.num_calls == 5 and not trace.cuts


@pytest.mark.parametrize("routes", ORDERS)
@pytest.mark.parametrize("task", TASKS)
def test_a_routed_supervisor_compiles_to_one_frame_and_equals_eager(
    chat: ChatEclectus, eclectus_server: EclectusServer, routes: tuple[str, ...], task: str
) -> None:
    """The router, the switch, every branch and the review go in one frame; the state is
    the eager run's; the server ran only the taken branch (router + worker + review, or the
    router alone on FINISH)."""
    app, value = lg_graphs.routed_supervisor(chat, routes, task)
    assert_routed_on_server(app, value, eclectus_server, routes)


def test_the_routes_taken_cover_every_branch(chat: ChatEclectus) -> None:
    """The grid above really exercises each literal (else it proves less than it says)."""
    taken = set()
    for routes in ORDERS:
        for task in TASKS:
            app, value = lg_graphs.routed_supervisor(chat, routes, task)
            taken.add(routes.index(app.invoke(value)["next"]))
    assert taken == {0, 1, 2}, taken


async def test_ainvoke_and_abatch_route_on_the_server(chat: ChatEclectus) -> None:
    app, value = lg_graphs.routed_supervisor(chat)
    compiled = compile(app)
    assert await compiled.ainvoke(value) == await app.ainvoke(value)
    inputs = [{"task": t} for t in TASKS]
    assert await compiled.abatch(inputs) == await app.abatch(inputs)


def test_a_router_reading_unknown_state_falls_back_to_the_cut(chat: ChatEclectus) -> None:
    """A routing function that reads a generated value other than the router's literal
    cannot be evaluated ahead of time: the edge is a client cut (two frames), still exact."""
    app, value = lg_graphs.routed_supervisor(chat)
    builder = app.builder
    branch = builder.branches["supervisor"]
    ends = next(iter(branch.values())).ends
    builder.branches.clear()
    builder.add_conditional_edges(
        "supervisor", lambda s: s["next"] if s["task"] and len(s) else END, ends
    )
    compiled = compile(builder.compile())
    assert compiled.invoke(value) == builder.compile().invoke(value)
    assert compiled.last_frames == 1  # the task is known: still a switch

    def reads_the_prompt(state: dict[str, Any]) -> str:
        return state["next"] if state.get("answer") is None else "FINISH"

    app, value = lg_graphs.routed_supervisor(chat)
    app.builder.branches.clear()
    app.builder.add_conditional_edges("supervisor", reads_the_prompt, ends)
    app = app.builder.compile()
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)


def test_a_branch_with_a_python_node_gives_the_fork_up(chat: ChatEclectus) -> None:
    """A branch needing the client (a Python node) makes the switch give up: the router
    runs as a cut, nothing speculative is shipped, and the result is the eager one."""
    app, value = lg_graphs.routed_supervisor(chat)
    builder = app.builder
    builder.nodes.pop("review")
    builder.add_node("review", lambda s: {"review": s["answer"].upper()})
    app = builder.compile()
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    trace = compiled.last_graph
    assert trace is not None and "no server switch" in trace.render()
    assert trace.num_calls <= 2  # the router and the taken worker: the fork was retracted


def test_a_router_that_loops_back_stays_a_cut(chat: ChatEclectus) -> None:
    """A supervisor loop (workers back to the router) would unroll without end: a cut."""
    app, value = lg_graphs.routed_supervisor(chat)
    builder = app.builder
    builder.edges.discard(("review", END))
    builder.add_edge("review", "supervisor")
    app = builder.compile()
    compiled = compile(app)
    config = {"recursion_limit": 12}
    try:
        expected: Any = app.invoke(value, config)
    except Exception as exc:  # the loop may not end within the limit: the same error
        with pytest.raises(type(exc)):
            compiled.invoke(value, config)
    else:
        assert compiled.invoke(value, config) == expected
    trace = compiled.last_graph
    assert trace is not None and "a branch loops back to the router" in trace.render()
    assert not trace.switched


def test_explain_says_which_edges_route_on_the_server(chat: ChatEclectus) -> None:
    """After a run, explain() names the edge that routed on the server, and the trace says
    why a router that could not was evaluated on the client instead."""
    app, value = lg_graphs.routed_supervisor(chat)
    compiled = compile(app)
    compiled.invoke(value)
    assert "supervisor -> ? (condition): server switch" in compiled.explain()
    looping, value = lg_graphs.constrained_supervisor(chat)
    compiled = compile(looping)
    compiled.invoke(value)
    text = compiled.explain()
    assert "supervisor -> ? (route): evaluated" in text
    assert "no server switch (for 'research' it reads state the client does not know" in text


@pytest.mark.parametrize("routes", ORDERS)
def test_callbacks_fire_for_the_taken_branch_only(
    chat: ChatEclectus, routes: tuple[str, ...]
) -> None:
    """A handler sees the calls the eager run made (router, worker, review), usage
    included, and none of the branches the server skipped."""
    app, value = lg_graphs.routed_supervisor(chat, routes)
    eager = counted(lambda config: app.invoke(value, config))
    compiled_graph = compile(app)
    compiled = counted(lambda config: compiled_graph.invoke(value, config))
    assert (compiled.ends, compiled.output_tokens) == (eager.ends, eager.output_tokens)
    assert sorted(compiled.starts) == sorted(eager.starts)
    assert compiled_graph.last_frames == 1


@pytest.mark.parametrize("mode", ["values", "updates"])
def test_streams_equal_eager(chat: ChatEclectus, mode: str) -> None:
    """A stream fetches step by step, so its router stays a cut; the chunks are eager's."""
    app, value = lg_graphs.routed_supervisor(chat)
    compiled = compile(app)
    assert list(compiled.stream(value, stream_mode=mode)) == list(
        app.stream(value, stream_mode=mode)
    )


def nested(chat: ChatEclectus, task: str) -> Any:
    """The routed supervisor, with a second router (deep or shallow) after the researcher
    and another on the supervisor's own literal after the writer."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate

    app, _ = lg_graphs.routed_supervisor(chat, lg_graphs.PICKS, task)
    builder = app.builder
    depth = chat.bind(extra_body={"structured_outputs": {"choice": ["deep", "shallow"]}})
    pick = PromptTemplate.from_template("How deep on {task}?") | depth | StrOutputParser()
    builder.edges.discard(("researcher", "review"))
    builder.add_node("depth", {"next": pick})
    builder.add_edge("researcher", "depth")
    builder.add_conditional_edges("depth", lambda s: s["next"], {"deep": "review", "shallow": END})
    return builder.compile()


@pytest.mark.parametrize("task", TASKS)
def test_nested_routers_switch_on_the_server(
    chat: ChatEclectus, eclectus_server: EclectusServer, task: str
) -> None:
    """A router inside a branch becomes a nested switch: still one frame, compiled ==
    eager, and the server runs only the calls on the path taken."""
    app = nested(chat, task)
    compiled = compile(app)
    before = calls_submitted(eclectus_server)
    out = compiled.invoke({"task": task})
    ran = calls_submitted(eclectus_server) - before
    assert out == app.invoke({"task": task})
    assert compiled.last_frames == 1, compiled.explain()
    trace = compiled.last_graph
    assert trace is not None and trace.render().count("switch on 'next'") == 2
    assert ran < trace.num_calls and not trace.cuts
