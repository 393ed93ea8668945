"""Switches over a real socket: routing on a router's constrained choice, on the server;
skipped branches never reach the engine; errors and limits (docs/protocol.md, Switches)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sched_helpers import drain, make_scheduler, submit
from scripted_engine import MarkedReplyEngine, prompt_text, scripted_text
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.protocol import CLIENT_FRAME, MAX_SWITCH_CASES, MAX_SWITCH_DEPTH, SwitchSpec

CHOICES = ["math", "poetry", "done"]


class ChoosingEngine(MarkedReplyEngine):
    """The scripted engine, but a call constrained to a ``choice`` answers the literal the
    prompt names after ``pick:`` (or one that is no choice, to test that error)."""

    kind = "choice"
    marker = "pick:"


def router(pick: str, call_id: str = "router", out: str = "route") -> dict[str, Any]:
    sampling = {"max_tokens": 4, "structured_outputs": {"choice": CHOICES}}
    return {
        "id": call_id,
        "segments": [{"text": f"Route this. pick: {pick}"}, {"gen": out, "sampling": sampling}],
    }


def worker(name: str, inputs: tuple[str, ...] = ()) -> dict[str, Any]:
    segments: list[dict[str, Any]] = [{"text": f"You are the {name} worker. "}]
    segments += [{"var": v} for v in inputs]
    segments.append({"gen": f"{name}_out", "sampling": {"max_tokens": 6}})
    return {"id": name, "segments": segments}


def switch_frame(pick: str, **extra: Any) -> dict[str, Any]:
    """The router, one worker per branch (each reads the route), a switch, gets on all."""
    frame: dict[str, Any] = {
        "type": "submit",
        "id": "s",
        "calls": [router(pick), worker("math", ("route",)), worker("poetry", ("route",))],
        "switches": [
            {"id": "sw", "on": "route", "cases": {"math": ["math"], "poetry": ["poetry"]}}
        ],
        "gets": [{"var": "route"}, {"var": "math_out"}, {"var": "poetry_out"}],
    }
    frame.update(extra)
    return frame


@pytest.fixture
async def choosing(make_server: ServerFactory) -> AsyncIterator[tuple[RawClient, ChoosingEngine]]:
    engine = ChoosingEngine()
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        yield client, engine


async def test_the_taken_branch_runs_and_the_other_is_skipped(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """The route's case runs with the route as input; the other branch never reaches the
    engine and its get answers ``skipped``."""
    client, engine = choosing
    assert (await client.ask(switch_frame("poetry")))["type"] == "ack"
    answers = await client.values(3)
    assert answers["route"]["text"] == "poetry"
    assert answers["poetry_out"]["text"] == scripted_text("You are the poetry worker. poetry", 6)
    assert answers["math_out"]["type"] == "error"
    assert answers["math_out"]["code"] == "skipped"
    assert "'poetry'" in answers["math_out"]["message"]
    prompts = [prompt_text(r) for r in engine.requests]
    assert len(prompts) == 2 and not any("math worker" in p for p in prompts)


async def test_a_case_with_no_nodes_skips_every_branch(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """A literal routed to nothing (say, to the end) skips both workers: only the router runs."""
    client, engine = choosing
    frame = switch_frame("done")
    frame["switches"][0]["cases"]["done"] = []
    assert (await client.ask(frame))["type"] == "ack"
    answers = await client.values(3)
    assert answers["route"]["text"] == "done"
    assert {answers[v]["code"] for v in ("math_out", "poetry_out")} == {"skipped"}
    assert len(engine.requests) == 1


async def test_consumers_of_a_skipped_output_are_skipped_and_others_run(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """A call downstream of the skipped branch is skipped (never dispatched); one downstream
    of the taken branch runs; an unguarded call not reading the branch runs as usual."""
    client, engine = choosing
    frame = switch_frame("math")
    frame["calls"] += [worker("after_math", ("math_out",)), worker("after_poetry", ("poetry_out",))]
    frame["calls"].append(worker("side"))
    frame["gets"] += [{"var": "after_math_out"}, {"var": "after_poetry_out"}, {"var": "side_out"}]
    assert (await client.ask(frame))["type"] == "ack"
    answers = await client.values(6)
    assert answers["after_poetry_out"]["code"] == "skipped"
    assert answers["after_math_out"]["type"] == "value"
    assert answers["side_out"]["type"] == "value"
    assert len(engine.requests) == 4  # router, math, after_math, side


async def test_a_value_that_is_no_case_fails_the_branches_naming_var_and_value(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """A literal of the choice that has no case: every guarded node fails with bad_request
    naming the variable and the value; the router's own value is still answered."""
    client, engine = choosing
    assert (await client.ask(switch_frame("done")))["type"] == "ack"
    answers = await client.values(3)
    assert answers["route"]["text"] == "done"
    for var in ("math_out", "poetry_out"):
        assert answers[var]["code"] == "bad_request"
        assert "'route' is 'done'" in answers[var]["message"]
    assert len(engine.requests) == 1


async def test_nothing_runs_before_a_get_and_the_router_waits_for_the_branch(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """Lazy activation through the switch: a get on a branch's output alone runs the router
    first (it is upstream through the gate), then the branch."""
    client, engine = choosing
    frame = switch_frame("math", gets=[])
    assert (await client.ask(frame))["type"] == "ack"
    assert engine.requests == []
    await client.send({"type": "get", "id": "g", "var": "math_out"})
    answers = await client.values(1)
    assert answers["math_out"]["type"] == "value"
    prompts = [prompt_text(r) for r in engine.requests]
    assert len(prompts) == 2 and "pick:" in prompts[0] and "math worker" in prompts[1]


async def test_a_switch_may_guard_nodes_of_an_earlier_fragment(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """Nodes shipped without a get (a split fragment) are still idle and may be guarded."""
    client, engine = choosing
    first = switch_frame("math", switches=[], gets=[])
    assert (await client.ask(first))["type"] == "ack"
    second = {"type": "submit", "id": "s2", "switches": switch_frame("math")["switches"]}
    second["gets"] = [{"var": "math_out"}, {"var": "poetry_out"}]
    assert (await client.ask(second))["type"] == "ack"
    answers = await client.values(2)
    assert answers["math_out"]["type"] == "value"
    assert answers["poetry_out"]["code"] == "skipped"
    assert len(engine.requests) == 2


def refused(frame: dict[str, Any], switch: dict[str, Any]) -> dict[str, Any]:
    frame["switches"] = [switch]
    return frame


BAD_SWITCHES = [
    # on: not a choice-constrained output
    ({"id": "sw", "on": "math_out", "cases": {"a": []}}, "bad_request", "switches[0].on"),
    ({"id": "sw", "on": "nope", "cases": {"math": []}}, "unknown_var", "switches[0].on"),
    # a case that is not one of the choices can never be taken
    ({"id": "sw", "on": "route", "cases": {"chess": ["math"]}}, "bad_request", "switches[0].cases"),
    ({"id": "sw", "on": "route", "cases": {"math": ["ghost"]}}, "bad_request", "switches[0].cases"),
    # guarding the router itself: the gate would wait on its own output
    ({"id": "sw", "on": "route", "cases": {"math": ["router"]}}, "cycle", "calls"),
    ({"id": "math", "on": "route", "cases": {"math": []}}, "bad_request", "switches[0].id"),
]


@pytest.mark.parametrize(("switch", "code", "field"), BAD_SWITCHES)
async def test_a_bad_switch_is_refused_whole(
    choosing: tuple[RawClient, ChoosingEngine], switch: dict[str, Any], code: str, field: str
) -> None:
    """The whole fragment is refused with the code and field; nothing of it exists after."""
    client, _ = choosing
    answer = await client.ask(refused(switch_frame("math"), switch))
    assert answer["type"] == "error" and answer["code"] == code, answer
    assert answer["field"].startswith(field), answer
    answer = await client.ask(switch_frame("math"))  # the ids are free again
    assert answer["type"] == "ack"


async def test_a_choice_variable_set_by_the_client_is_refused(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """A variable with no constrained producer (a client's set) cannot be switched on."""
    client, _ = choosing
    frame = switch_frame("math")
    frame["calls"] = frame["calls"][1:]
    frame["vars"] = [{"id": "route"}]
    answer = await client.ask(frame)
    assert answer["code"] == "bad_request" and answer["field"] == "switches[0].on"
    assert "choice" in answer["message"]


async def test_a_node_guarded_twice_is_refused(choosing: tuple[RawClient, ChoosingEngine]) -> None:
    client, _ = choosing
    frame = switch_frame("math")
    frame["switches"].append({"id": "sw2", "on": "route", "cases": {"poetry": ["math"]}})
    answer = await client.ask(frame)
    assert answer["code"] == "bad_request" and answer["field"].startswith("switches[1].cases")


async def test_nesting_deeper_than_the_limit_is_refused(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """Each router guarded by the switch before it: MAX_SWITCH_DEPTH nest, one more does not."""
    client, _ = choosing

    def chain(depth: int, frame_id: str) -> dict[str, Any]:
        calls = [router("math", f"{frame_id}r{i}", f"{frame_id}o{i}") for i in range(depth + 1)]
        switches = [
            {
                "id": f"{frame_id}w{i}",
                "on": f"{frame_id}o{i}",
                "cases": {"math": [f"{frame_id}r{i + 1}"]},
            }
            for i in range(depth)
        ]
        return {"type": "submit", "id": frame_id, "calls": calls, "switches": switches}

    assert (await client.ask(chain(MAX_SWITCH_DEPTH, "a")))["type"] == "ack"
    answer = await client.ask(chain(MAX_SWITCH_DEPTH + 1, "b"))
    assert answer["code"] == "bad_request" and "MAX_SWITCH_DEPTH" in answer["message"]


async def test_nested_switches_route_twice_on_the_server(
    choosing: tuple[RawClient, ChoosingEngine],
) -> None:
    """A second router inside the taken branch routes again; the outer skipped branch's
    inner switch skips its own branches too."""
    client, engine = choosing
    frame = switch_frame("math")
    frame["calls"] += [router("poetry", "inner", "inner_route"), worker("deep", ("inner_route",))]
    frame["switches"][0]["cases"]["math"].append("inner")
    frame["switches"].append({"id": "sw2", "on": "inner_route", "cases": {"poetry": ["deep"]}})
    frame["gets"].append({"var": "deep_out"})
    assert (await client.ask(frame))["type"] == "ack"
    answers = await client.values(4)
    assert answers["deep_out"]["type"] == "value"
    assert answers["poetry_out"]["code"] == "skipped"
    assert len(engine.requests) == 4  # router, math, inner, deep


def test_a_switch_lists_at_most_the_case_limit() -> None:
    cases = {f"c{i}": [] for i in range(MAX_SWITCH_CASES + 1)}
    with pytest.raises(ValueError, match="cases"):
        SwitchSpec(id="w", on="r", cases=cases)


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.lists(st.text(min_size=1, max_size=6), max_size=3, unique=True),
        min_size=1,
        max_size=5,
    )
)
def test_a_switch_round_trips_or_is_refused_for_a_node_in_two_cases(
    cases: dict[str, list[str]],
) -> None:
    """Any switch parses back equal through the wire; a node in two cases is refused."""
    frame = {"type": "submit", "id": "s", "switches": [{"id": "w", "on": "r", "cases": cases}]}
    nodes = [n for ids in cases.values() for n in ids]
    if len(set(nodes)) != len(nodes):
        with pytest.raises(ValueError, match="more than one case"):
            CLIENT_FRAME.validate_python(frame)
        return
    parsed = CLIENT_FRAME.validate_python(frame)
    assert CLIENT_FRAME.validate_json(parsed.model_dump_json()) == parsed
    assert parsed.switches[0].cases == cases


async def test_the_router_inherits_the_strongest_objective_of_its_branches() -> None:
    """A latency get on one branch makes the router urgent (it is upstream through the
    gate); the branch calls stay waiting until the switch resolves."""
    engine = ChoosingEngine(hold=True)
    sched = make_scheduler(engine)
    app = sched.open_app("a")
    frame = switch_frame("math")
    del frame["type"], frame["id"]
    frame["gets"] = [
        {"var": "math_out", "criteria": "throughput"},
        {"var": "poetry_out", "criteria": "latency"},
    ]
    submit(sched, app, **frame)
    nodes = app.graph.nodes
    assert nodes["router"].objective.criteria == "latency"
    assert nodes["poetry"].objective.criteria == "latency"
    assert nodes["math"].objective.criteria == "throughput"
    assert {nodes["math"].state.value, nodes["poetry"].state.value} == {"waiting"}
    engine.release()
    await drain(sched)
    assert nodes["poetry"].state.value == "failed" and len(engine.requests) == 2
