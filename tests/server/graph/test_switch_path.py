"""Switches on a field of a JSON reply (``SwitchSpec.path``) over a real socket: the server
routes on the field a JSON Schema pins to an ``enum``; submit refuses a path the schema does
not pin, or a case outside the enum; a reply that is not JSON fails the branches like a
value that is no case (docs/protocol.md, Switches)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripted_engine import MarkedReplyEngine, scripted_text
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.protocol import MAX_SWITCH_PATH, SwitchSpec
from eclectus.protocol.schema_enum import NotPinned, field_at, pinned_literals

ROUTER_SCHEMA: dict[str, Any] = {
    "title": "Router",
    "type": "object",
    "properties": {
        "next": {"enum": ["math", "poetry", "done"], "type": "string"},
        "why": {"type": "string"},
        "inner": {
            "type": "object",
            "properties": {"pick": {"$ref": "#/$defs/Pick"}},
            "required": ["pick"],
        },
        "maybe": {"enum": ["math", "poetry"], "type": "string"},
    },
    "required": ["next", "why", "inner"],
    "$defs": {"Pick": {"enum": ["math", "poetry"], "type": "string", "title": "Pick"}},
}


class JsonEngine(MarkedReplyEngine):
    """The scripted engine, but a call constrained to a JSON Schema answers the text the
    prompt holds after ``json:`` (valid or not, to test both)."""

    kind = "json_schema"
    marker = "json:"


def reply(next_: str = "poetry", pick: str = "math") -> str:
    return f'{{"next": "{next_}", "why": "x", "inner": {{"pick": "{pick}"}}}}'


def frame_on(text: str, path: list[str], cases: dict[str, list[str]] | None = None) -> dict:
    """A JSON router answering ``text``, one worker per branch, a switch on ``path``."""
    sampling = {"max_tokens": 64, "structured_outputs": {"json": ROUTER_SCHEMA}}
    router = {
        "id": "router",
        "segments": [{"text": f"json: {text}"}, {"gen": "route", "sampling": sampling}],
    }
    workers = [
        {
            "id": name,
            "segments": [
                {"text": f"You are the {name} worker."},
                {"gen": f"{name}_out", "sampling": {"max_tokens": 6}},
            ],
        }
        for name in ("math", "poetry")
    ]
    return {
        "type": "submit",
        "id": "s",
        "calls": [router, *workers],
        "switches": [
            {
                "id": "sw",
                "on": "route",
                "path": path,
                "cases": cases or {"math": ["math"], "poetry": ["poetry"], "done": []},
            }
        ],
        "gets": [{"var": "route"}, {"var": "math_out"}, {"var": "poetry_out"}],
    }


@pytest.fixture
async def json_router(make_server: ServerFactory) -> AsyncIterator[tuple[RawClient, JsonEngine]]:
    engine = JsonEngine()
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        yield client, engine


@pytest.mark.parametrize(("taken", "other"), [("math", "poetry"), ("poetry", "math")])
async def test_the_field_routes_and_the_other_branch_never_runs(
    json_router: tuple[RawClient, JsonEngine], taken: str, other: str
) -> None:
    client, engine = json_router
    assert (await client.ask(frame_on(reply(taken), ["next"])))["type"] == "ack"
    answers = await client.values(3)
    assert answers["route"]["text"] == reply(taken)
    assert answers[f"{taken}_out"]["text"] == scripted_text(f"You are the {taken} worker.", 6)
    assert answers[f"{other}_out"]["code"] == "skipped"
    assert f"'{taken}'" in answers[f"{other}_out"]["message"]
    assert len(engine.requests) == 2  # the router and the taken worker only


async def test_a_nested_path_through_a_ref_routes(
    json_router: tuple[RawClient, JsonEngine],
) -> None:
    client, engine = json_router
    frame = frame_on(
        reply("done", "poetry"), ["inner", "pick"], {"math": ["math"], "poetry": ["poetry"]}
    )
    assert (await client.ask(frame))["type"] == "ack"
    answers = await client.values(3)
    assert answers["poetry_out"]["type"] == "value" and answers["math_out"]["code"] == "skipped"
    assert len(engine.requests) == 2


@pytest.mark.parametrize("text", ['{"next": "po', "not json", '{"why": "x"}'])
async def test_a_reply_without_the_field_fails_the_branches(
    json_router: tuple[RawClient, JsonEngine], text: str
) -> None:
    """Only a broken constraint (a cut budget without the guarantee) gives this: every
    guarded node fails with bad_request naming the switch and the path; none runs."""
    client, engine = json_router
    assert (await client.ask(frame_on(text, ["next"])))["type"] == "ack"
    answers = await client.values(3)
    assert answers["route"]["text"] == text
    for var in ("math_out", "poetry_out"):
        assert answers[var]["code"] == "bad_request"
        assert "switch 'sw'" in answers[var]["message"] and "['next']" in answers[var]["message"]
        assert "not one of its cases" in answers[var]["message"]
    assert len(engine.requests) == 1


BAD_PATHS = [
    (["nope"], "switches[0].path", "no property 'nope'"),
    (["why"], "switches[0].path", "not pinned to an enum"),
    (["maybe"], "switches[0].path", "not required"),
    (["next", "deeper"], "switches[0].path", "no property 'deeper'"),
]


@pytest.mark.parametrize(("path", "field", "why"), BAD_PATHS)
async def test_a_path_the_schema_does_not_pin_is_refused(
    json_router: tuple[RawClient, JsonEngine], path: list[str], field: str, why: str
) -> None:
    client, _ = json_router
    answer = await client.ask(frame_on(reply(), path, {"math": ["math"]}))
    assert answer["type"] == "error" and answer["code"] == "bad_request", answer
    assert answer["field"] == field and why in answer["message"], answer
    assert "switch 'sw'" in answer["message"] and repr(path) in answer["message"]
    assert (await client.ask(frame_on(reply(), ["next"])))["type"] == "ack"  # ids free again


async def test_a_case_outside_the_enum_is_refused(
    json_router: tuple[RawClient, JsonEngine],
) -> None:
    client, _ = json_router
    answer = await client.ask(frame_on(reply(), ["next"], {"chess": ["math"]}))
    assert answer["code"] == "bad_request" and answer["field"] == "switches[0].cases", answer
    assert "'chess'" in answer["message"] and "['next']" in answer["message"]


async def test_a_path_on_a_choice_or_unconstrained_call_is_refused(
    json_router: tuple[RawClient, JsonEngine],
) -> None:
    """A path needs a JSON Schema: a switch with one on a worker's free text is refused."""
    client, _ = json_router
    frame = frame_on(reply(), ["next"])
    frame["switches"][0].update(on="math_out", cases={"math": []})
    answer = await client.ask(frame)
    assert answer["code"] == "bad_request" and answer["field"] == "switches[0].on", answer
    assert "JSON Schema" in answer["message"]


def test_a_path_is_limited() -> None:
    SwitchSpec(id="w", on="r", path=["k"] * MAX_SWITCH_PATH, cases={"a": []})
    with pytest.raises(ValueError, match="path"):
        SwitchSpec(id="w", on="r", path=["k"] * (MAX_SWITCH_PATH + 1), cases={"a": []})


@given(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6, unique=True))
def test_pinned_literals_round_trip_any_enum_and_the_field_reads_back(literals: list[str]) -> None:
    """Whatever the enum, the literals come back in order and each literal's JSON reply
    reads back as itself; a const pins one."""
    schema = {"type": "object", "properties": {"k": {"enum": literals}}, "required": ["k"]}
    assert pinned_literals(schema, ["k"]) == tuple(literals)
    for literal in literals:
        assert field_at(json.dumps({"k": literal}), ["k"]) == literal
    const = {"type": "object", "properties": {"k": {"const": literals[0]}}, "required": ["k"]}
    assert pinned_literals(const, ["k"]) == (literals[0],)


def test_a_ref_cycle_or_dangling_ref_is_not_pinned() -> None:
    cyclic = {
        "properties": {"k": {"$ref": "#/$defs/A"}},
        "required": ["k"],
        "$defs": {"A": {"$ref": "#/$defs/A"}},
    }
    with pytest.raises(NotPinned, match="cycle"):
        pinned_literals(cyclic, ["k"])
    with pytest.raises(NotPinned, match="points to nothing"):
        pinned_literals({"properties": {"k": {"$ref": "#/$defs/B"}}, "required": ["k"]}, ["k"])
