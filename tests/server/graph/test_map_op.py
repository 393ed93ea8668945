"""Maps over a real socket: a fan-out per JSON array element, no client round trip; the
spread ops over a map's output; its errors and limits (docs/protocol.md, Maps)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripted_engine import ScriptedEngine, scripted_text
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.protocol import CLIENT_FRAME, MapSpec
from eclectus.server.graph.map_op import MapFailed, element_text, parse_items

PROMPT = "Step: "


def map_frame(items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A submit: ``items`` (a var spec), a map writing one call per element, a join."""
    frame: dict[str, Any] = {
        "type": "submit",
        "id": "s",
        "vars": [items, {"id": "ctx", "value": "ctx!"}],
        "maps": [
            {
                "id": "m",
                "items": items["id"],
                "element": "e",
                "call": {
                    "id": "worker",
                    "segments": [
                        {"var": "ctx"},
                        {"text": PROMPT},
                        {"var": "e"},
                        {"gen": "out", "sampling": {"max_tokens": 6}},
                    ],
                },
                "output": "results",
            }
        ],
        "ops": [
            {
                "id": "j",
                "op": "join",
                "inputs": ["results"],
                "output": "all",
                "sep": "|",
                "spread": True,
            },
            {"id": "r", "op": "repr_list", "inputs": ["results"], "output": "rep", "spread": True},
        ],
        "gets": [{"var": "results"}, {"var": "all"}, {"var": "rep"}],
    }
    frame.update(extra)
    return frame


def expected(elements: list[str]) -> list[str]:
    return [scripted_text(f"ctx!{PROMPT}{e}", 6) for e in elements]


async def test_a_map_fans_out_one_call_per_element(
    client: RawClient, engine: ScriptedEngine
) -> None:
    """Each element is bound into its own call; output, join and repr come back together."""
    items = ["alpha", "beta", "gamma"]
    assert (await client.ask(map_frame({"id": "plan", "value": json.dumps(items)})))[
        "type"
    ] == "ack"
    answers = await client.values(3)
    results = expected(items)
    assert json.loads(answers["results"]["text"]) == results
    assert answers["all"]["text"] == "|".join(results)
    assert answers["rep"]["text"] == repr(results)
    assert len(engine.requests) == 3


async def test_items_set_by_the_client_later(client: RawClient, engine: ScriptedEngine) -> None:
    """The map waits for its items; a set releases the fan-out."""
    await client.ask(map_frame({"id": "plan"}))
    assert engine.requests == []
    await client.send({"type": "set", "id": "x", "var": "plan", "value": '["a", {"k": 1}, 2]'})
    answers = await client.values(3)
    assert json.loads(answers["results"]["text"]) == expected(["a", '{"k":1}', "2"])


async def test_an_empty_array_and_a_fenced_one(client: RawClient) -> None:
    """[] finishes at once with no call; a ```json fence around the array is allowed."""
    await client.ask(map_frame({"id": "plan", "value": "[]"}))
    answers = await client.values(3)
    assert answers["results"]["text"] == "[]" and answers["all"]["text"] == ""
    assert parse_items('```json\n["x"]\n```') == ["x"]
    assert element_text(1.5) == "1.5" and element_text("é") == "é"


@pytest.mark.parametrize(
    ("items", "needle"), [('{"a": 1}', "a JSON dict, not an array"), ("nope", "not JSON")]
)
async def test_items_that_are_not_an_array_fail_the_map(
    client: RawClient, items: str, needle: str
) -> None:
    """Bad items fail the map's output and everything downstream with bad_request."""
    await client.ask(map_frame({"id": "plan", "value": items}))
    answers = await client.values(3)
    assert {a["code"] for a in answers.values()} == {"bad_request"}
    assert needle in answers["results"]["message"]


@pytest.mark.parametrize(
    ("config", "items", "needle"),
    [
        ({"max_map_items": 2}, ["a", "b", "c"], "max_map_items=2"),
        ({"max_map_element_bytes": 4}, ["a", "bcdef"], "element 1 has 5 bytes"),
        ({"max_calls_per_session": 5}, ["a", "b", "c"], "max_calls_per_session=5"),
    ],
)
async def test_limits_fail_the_map_with_limit_exceeded(
    make_server: ServerFactory, config: dict[str, int], items: list[str], needle: str
) -> None:
    """Over a fan-out limit, the map fails before any instance runs."""
    engine = ScriptedEngine()
    server = await make_server(engine, **config)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.ask(map_frame({"id": "plan", "value": json.dumps(items)}))
        answers = await client.values(3)
    assert answers["results"]["code"] == "limit_exceeded"
    assert needle in answers["results"]["message"]
    assert engine.requests == []


async def test_a_failed_instance_fails_the_map(make_server: ServerFactory) -> None:
    """An engine error in one instance reaches the map's output and the join."""
    engine = ScriptedEngine(fail_if=lambda r: r.request_id.endswith("m#1/0"))
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.ask(map_frame({"id": "plan", "value": '["a", "b"]'}))
        answers = await client.values(3)
    assert answers["results"]["code"] == "engine_error"
    assert answers["all"]["code"] == "engine_error"


async def test_instances_are_freed_when_the_map_is_done(server: Any, client: RawClient) -> None:
    """Instance calls and their variables do not stay in the session's graph."""
    await client.ask(map_frame({"id": "plan", "value": '["a", "b"]'}))
    await client.values(3)
    (session,) = server.scheduler.snapshot()
    app = server.scheduler.app(session.session_id)
    assert app is not None
    assert not [v for v in app.graph.vars if "#" in v]
    assert not [n for n in app.graph.nodes if "#" in n]


@pytest.mark.parametrize(
    ("change", "code", "field"),
    [
        (
            lambda f: f["maps"][0]["call"]["segments"].append({"gen": "o2"}),
            "bad_request",
            "maps[0].call",
        ),
        (lambda f: f["maps"][0].update(element="plan"), "bad_request", "maps[0]"),
        (lambda f: f["maps"][0].update(items="nope"), "unknown_var", "maps[0]"),
        (lambda f: f["ops"][1].update(inputs=["ctx"]), "bad_request", "ops[1].inputs"),
        (lambda f: f["maps"][0]["call"].update(model="other"), "unknown_model", None),
    ],
)
async def test_a_bad_map_is_refused_whole(
    client: RawClient, change: Any, code: str, field: str | None
) -> None:
    """Staging errors answer the submit with one error naming the field; nothing is added."""
    frame = map_frame({"id": "plan", "value": "[]"})
    change(frame)
    answer = await client.ask(frame)
    assert answer["type"] == "error" and answer["code"] == code
    if field is not None:
        assert answer["field"] == field
    assert (await client.ask(map_frame({"id": "plan", "value": '["z"]'})))["type"] == "ack"


def test_a_spread_op_takes_one_input() -> None:
    """The wire model refuses a spread op with several inputs."""
    frame = map_frame({"id": "plan", "value": "[]"})
    frame["ops"][0]["inputs"] = ["results", "ctx"]
    with pytest.raises(ValueError, match="exactly one input"):
        CLIENT_FRAME.validate_python(frame)
    assert MapSpec.model_validate(frame["maps"][0]).element == "e"


def test_serve_flags_set_the_map_limits() -> None:
    """``eclectus serve --max-map-items/--max-map-element-bytes`` reach the config; 0 is
    refused by the parser."""
    import argparse

    from eclectus.server.flags import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-map-items", "7", "--max-map-element-bytes", "9"])
    config = config_from_args(args)
    assert (config.max_map_items, config.max_map_element_bytes) == (7, 9)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-map-items", "0"])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(items=st.lists(JSON_VALUES, max_size=6), fenced=st.booleans())
def test_items_parse_back_and_elements_bind_their_text(items: list[Any], fenced: bool) -> None:
    """Any JSON array (fenced or not) parses back to itself; a string element binds its
    own text, any other element its compact JSON, which parses back to the element."""
    text = json.dumps(items, ensure_ascii=False)
    assert parse_items(f"```json\n{text}\n```" if fenced else f"  {text}\n") == items
    for element in items:
        bound = element_text(element)
        assert bound == element if isinstance(element, str) else json.loads(bound) == element


async def test_items_path_picks_the_array_inside_an_object(client: RawClient) -> None:
    """items_path: a planner's {"steps": [...]} maps over its steps."""
    frame = map_frame({"id": "plan", "value": '{"steps": ["a", "b"], "why": "x"}'})
    frame["maps"][0]["items_path"] = ["steps"]
    await client.ask(frame)
    answers = await client.values(3)
    assert len(json.loads(answers["results"]["text"])) == 2


@pytest.mark.parametrize(
    ("text", "path", "needle"),
    [
        ('{"steps": []}', ["plan"], "items has no key 'plan'"),
        ('{"a": {"b": 1}}', ["a", "c"], "items['a'] has no key 'c'"),
        ('["x"]', ["steps"], "items has no key 'steps'"),
        ('{"steps": "x"}', ["steps"], "a JSON str, not an array"),
    ],
)
def test_a_bad_items_path_is_bad_request(text: str, path: list[str], needle: str) -> None:
    """A path that does not lead to an array fails the map with bad_request, naming it."""
    with pytest.raises(MapFailed, match=re.escape(needle)) as caught:
        parse_items(text, path)
    assert caught.value.code == "bad_request"
