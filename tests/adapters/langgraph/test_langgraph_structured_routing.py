"""Routing on the server for the LangGraph-docs router: a node
``prompt | model.with_structured_output(Router)`` (``Router`` a TypedDict whose ``next`` is a
``Literal``), its dict merged into the state, and a conditional edge reading ``next``,
compiles to a protocol switch on the JSON field (``SwitchSpec.path``). Compiled == eager
(tiny model, greedy), one client frame per run instead of two, the branches not taken never
reach the engine; a router the compiler cannot prove falls back to the client cut, exactly
(a Pydantic router: test_langgraph_model_routing.py)."""

from __future__ import annotations

import lg_graphs
import pytest
from test_langgraph_routing import ORDERS, TASKS, assert_routed_on_server

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import compile
from eclectus.server.front.app import EclectusServer


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


@pytest.mark.parametrize("routes", ORDERS)
@pytest.mark.parametrize("task", TASKS[:2])
def test_a_structured_router_compiles_to_one_frame_and_equals_eager(
    chat: ChatEclectus, eclectus_server: EclectusServer, routes: tuple[str, ...], task: str
) -> None:
    """Router, switch, both branches and the reviews go in one frame; the state is the
    eager run's; the server ran only the taken branch (router + worker + review, or the
    router alone when the literal routes to the end)."""
    app, value = lg_graphs.structured_supervisor(chat, routes, task)
    assert_routed_on_server(app, value, eclectus_server, routes)


def test_the_structured_routes_taken_cover_every_branch(chat: ChatEclectus) -> None:
    """The grid above really takes each destination (else it proves less than it says)."""
    taken = set()
    for routes in ORDERS:
        app, value = lg_graphs.structured_supervisor(chat, routes, TASKS[0])
        taken.add(routes.index(app.invoke(value)["next"]))
    assert taken == {0, 1, 2}, taken


async def test_ainvoke_and_abatch_route_on_the_field(chat: ChatEclectus) -> None:
    app, value = lg_graphs.structured_supervisor(chat)
    compiled = compile(app)
    assert await compiled.ainvoke(value) == await app.ainvoke(value)
    assert compiled.last_frames == 1
    inputs = [{"task": t} for t in TASKS]
    assert await compiled.abatch(inputs) == await app.abatch(inputs)


def test_a_router_schema_allowing_more_keys_stays_a_cut(chat: ChatEclectus) -> None:
    """``additionalProperties`` allowed: the reply might hold other state keys, so its
    fields are not split ahead of time; the edge is a client cut, still exact."""
    schema = {
        "title": "Router",
        "type": "object",
        "properties": {"next": {"enum": list(lg_graphs.PICKS), "type": "string"}},
        "required": ["next"],
        "additionalProperties": True,
    }
    app, value = lg_graphs.structured_supervisor(chat, router_schema=schema)
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    assert compiled.last_frames == 2
    assert "switch on" not in compiled.explain()


def test_streaming_stays_exact(chat: ChatEclectus) -> None:
    """While streaming, steps are fetched one by one: no switch, the same chunks."""
    app, value = lg_graphs.structured_supervisor(chat)
    compiled = compile(app)
    assert list(compiled.stream(value)) == list(app.stream(value))
