"""Routing on the server for a Pydantic router (``with_structured_output(Route)``, ``Route``
a BaseModel whose ``next`` is a ``Literal`` or a ``str`` Enum): the node returning the model
(LangGraph writes its fields) or writing it whole to a key (the edge reads
``s["route"].next``) compiles to a switch on the reply's JSON field. Compiled == eager (tiny
model, greedy; the state holds real ``Route`` instances), one client frame per run instead
of two, only the taken branch runs; a model the compiler cannot prove exact (a validator, a
field with a default, a field that is no literal, an edge reading another field) stays the
client cut, two frames when the route goes on, still exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import lg_graphs
import pytest
from lg_graphs import EnumRoute, Pick
from pydantic import BaseModel, Field, create_model, field_validator, model_validator
from test_langgraph_routing import ORDERS, TASKS, calls_submitted

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import compile
from eclectus.server.front.app import EclectusServer


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


def assert_switched(app: Any, value: dict[str, Any], server: EclectusServer, end: bool) -> Any:
    """Compiled ``app`` equals the eager run (state and ``updates`` chunks are checked
    elsewhere) in one frame with a switch and no cut; the server ran the router alone when
    ``end`` holds for the output, else router, worker and review. Returns the output."""
    compiled = compile(app)
    before = calls_submitted(server)
    out = compiled.invoke(value)
    ran = calls_submitted(server) - before
    assert out == app.invoke(value)
    assert compiled.last_frames == 1, compiled.explain()
    assert ran == (1 if end(out) else 3)
    trace = compiled.last_graph
    assert trace is not None and "switch on " in trace.render()
    assert trace.num_calls == 5 and not trace.cuts
    return out


def assert_cut(build: Callable[[tuple[str, ...]], Any], server: EclectusServer) -> None:
    """``build(routes)`` (an app and its input) compiled equals the eager run as a client
    cut, no switch, for each order of the routes: two frames and three calls when the
    route goes on to a worker (the router's reply, then worker and review), one frame and
    the router alone when it ends. The router's schema is the same in every order, so its
    greedy reply is too, and each literal ends the run in exactly one order: both cut
    paths run whatever ``tiny`` picks."""
    went_on, end_frames = [], []
    for routes in ORDERS:
        app, value = build(routes)
        compiled = compile(app)
        before = calls_submitted(server)
        out = compiled.invoke(value)
        ran = calls_submitted(server) - before
        assert out == app.invoke(value)
        assert "switch on" not in compiled.explain()
        goes_on = "answer" in out
        assert ran == (3 if goes_on else 1), (routes, ran)
        if goes_on:
            assert compiled.last_frames == 2, (routes, compiled.explain())
        else:
            end_frames.append(compiled.last_frames)
        went_on.append(goes_on)
    assert sorted(went_on) == [False, True, True], went_on
    # a cut that ends the run pays one round trip: a str field's break gets the reply too
    assert end_frames == [1], end_frames


@pytest.mark.parametrize("routes", ORDERS)
def test_a_model_the_node_returns_is_switched_on_its_field(
    chat: ChatEclectus, eclectus_server: EclectusServer, routes: tuple[str, ...]
) -> None:
    """``add_node("supervisor", router)``: LangGraph writes ``next`` from the model; the
    three orders of the literals route to the researcher, the writer and the end."""
    app, value = lg_graphs.structured_supervisor(
        chat, routes, router_schema=lg_graphs.route_model(routes)
    )
    out = assert_switched(app, value, eclectus_server, lambda o: o["next"] == routes[2])
    assert type(out["next"]) is str


@pytest.mark.parametrize("routes", ORDERS)
def test_a_model_written_whole_is_switched_on_its_field(
    chat: ChatEclectus, eclectus_server: EclectusServer, routes: tuple[str, ...]
) -> None:
    """``{"route": router}`` and an edge reading ``s["route"].next``: the state holds the
    real ``Route`` the eager run parsed, with its other fields."""
    cls = lg_graphs.route_model(routes, why=(str, ...))
    app, value = lg_graphs.model_supervisor(chat, routes, route_cls=cls)
    out = assert_switched(app, value, eclectus_server, lambda o: o["route"].next == routes[2])
    assert type(out["route"]) is cls


def test_the_model_routes_taken_cover_every_branch(chat: ChatEclectus) -> None:
    """The orders above really take each destination (else they prove less than they say)."""
    taken = set()
    for routes in ORDERS:
        app, value = lg_graphs.model_supervisor(chat, routes)
        taken.add(routes.index(app.invoke(value)["route"].next))
    assert taken == {0, 1, 2}, taken


@pytest.mark.parametrize("whole", [False, True])
def test_an_enum_field_is_switched_and_the_state_holds_the_member(
    chat: ChatEclectus, eclectus_server: EclectusServer, whole: bool
) -> None:
    """A ``str`` Enum field: the edge sees the member, as eagerly, and so does the state."""
    if whole:
        app, value = lg_graphs.model_supervisor(chat, route_cls=EnumRoute)
        out = assert_switched(app, value, eclectus_server, lambda o: o["route"].next == "FINISH")
        assert isinstance(out["route"].next, Pick)
    else:
        app, value = lg_graphs.structured_supervisor(chat, router_schema=EnumRoute)
        out = assert_switched(app, value, eclectus_server, lambda o: o["next"] == "FINISH")
        assert isinstance(out["next"], Pick)


def test_streams_and_async_equal_eager(chat: ChatEclectus) -> None:
    """``updates`` chunks (fetched step by step) and ``ainvoke`` equal the eager run's."""
    app, value = lg_graphs.model_supervisor(chat)
    compiled = compile(app)
    assert list(compiled.stream(value, stream_mode="updates")) == list(
        app.stream(value, stream_mode="updates")
    )


async def test_ainvoke_routes_on_the_model_field(chat: ChatEclectus) -> None:
    app, value = lg_graphs.model_supervisor(chat)
    compiled = compile(app)
    assert await compiled.ainvoke(value) == await app.ainvoke(value)
    assert compiled.last_frames == 1


class Validated(BaseModel):
    next: Literal["research", "write", "FINISH"]

    @field_validator("next")
    @classmethod
    def finish_on_write(cls, value: str) -> str:
        return "FINISH" if value == "write" else value


class Checked(BaseModel):
    next: Literal["research", "write", "FINISH"]

    @model_validator(mode="after")
    def keep(self) -> Checked:
        return self


FALLBACKS: dict[str, type[BaseModel]] = {
    "field validator": Validated,
    "model validator": Checked,
    "a default": create_model("Route", next=(Literal[lg_graphs.PICKS], "FINISH")),
    # a str the schema alone pins: the reply is a literal, but the type does not say so
    "no literal": create_model(
        "Route", next=(str, Field(json_schema_extra={"enum": list(lg_graphs.PICKS)}))
    ),
}


@pytest.mark.parametrize("why", sorted(FALLBACKS))
@pytest.mark.parametrize("whole", [False, True])
def test_a_model_not_provably_exact_stays_a_cut(
    chat: ChatEclectus, eclectus_server: EclectusServer, why: str, whole: bool
) -> None:
    """A validator may change the field after the JSON; a default lets the reply leave it
    out; a ``str`` is no literal (even if its schema is an enum): the client cut (two
    frames when the route goes on), equal to eager."""
    cls = FALLBACKS[why]
    if whole:
        assert_cut(
            lambda routes: lg_graphs.model_supervisor(chat, routes, route_cls=cls), eclectus_server
        )
    else:
        assert_cut(
            lambda routes: lg_graphs.structured_supervisor(chat, routes, router_schema=cls),
            eclectus_server,
        )


@pytest.mark.parametrize("whole", [False, True])
def test_a_str_field_cut_that_ends_the_run_costs_one_frame(
    chat: ChatEclectus, eclectus_server: EclectusServer, whole: bool
) -> None:
    """A ``str`` router field (no literal): the edge reads it through a json_field op,
    and the break that fetches it fetches the reply too, so a run that ends at the router
    costs one client frame (the server counts the same) and ``explain()`` names the break."""
    cls = FALLBACKS["no literal"]
    for routes in ORDERS:  # the order whose greedy pick ends the run
        if whole:
            app, value = lg_graphs.model_supervisor(chat, routes, route_cls=cls)
        else:
            app, value = lg_graphs.structured_supervisor(chat, routes, router_schema=cls)
        eager = app.invoke(value)
        if "answer" not in eager:
            break
    assert "answer" not in eager
    compiled = compile(app)
    compiled.invoke(value)  # a warm-up: the session's first frames (its hello) are not the run's
    before = eclectus_server.ctx.metrics.client_frames
    assert compiled.invoke(value) == eager
    frames = eclectus_server.ctx.metrics.client_frames - before
    assert frames == compiled.last_frames == 1, compiled.explain()
    assert "BREAK  router after 'supervisor': its destination is a server value" in (
        compiled.explain()
    )


def test_an_edge_reading_an_unknown_field_stays_a_cut(
    chat: ChatEclectus, eclectus_server: EclectusServer
) -> None:
    """The edge also reads ``why`` (not known before the reply), even through ``getattr``
    with a default: it cannot be evaluated ahead of time, so the cut runs it."""
    cls = lg_graphs.route_model(why=(str, ...))

    def edge(state: dict[str, Any]) -> str:
        route = state["route"]
        return route.next if getattr(route, "why", "") != "" else "FINISH"

    assert_cut(
        lambda routes: lg_graphs.model_supervisor(chat, routes, route_cls=cls, edge=edge),
        eclectus_server,
    )


@pytest.mark.parametrize("task", TASKS[1:])
def test_other_tasks_equal_eager(
    chat: ChatEclectus, eclectus_server: EclectusServer, task: str
) -> None:
    app, value = lg_graphs.model_supervisor(chat, task=task)
    assert_switched(app, value, eclectus_server, lambda o: o["route"].next == "FINISH")
