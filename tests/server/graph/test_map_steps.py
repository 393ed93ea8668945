"""Map steps over a real socket: a map whose per-element work is a pipeline of calls
(MapSpec.then), its step outputs, errors and limits (docs/protocol.md, Maps); and, on the
graph alone, the shape an expansion takes for any number of steps and elements."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted_engine import ScriptedEngine, scripted_text
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.protocol import MAX_MAP_STEPS, Submit
from eclectus.server.config import ServerConfig
from eclectus.server.graph.fragment import stage
from eclectus.server.graph.graph import Graph, NodeState

DRAFT, REVIEW, REVISE = "Draft ", "Review ", "Revise "


def step(call_id: str, segments: list[dict[str, Any]], out: str, tokens: int = 6) -> dict:
    """A step's CallSpec: ``segments`` then its one output ``out``."""
    gen = {"gen": out, "sampling": {"max_tokens": tokens}}
    return {"id": call_id, "segments": [*segments, gen]}


def steps_frame(items: str, *, step_outputs: bool = True, **extra: Any) -> dict[str, Any]:
    """A submit: a 3-step map (draft the element, review the draft, revise the draft per
    the review, each reading the outer ``ctx``), its output and step outputs asked for."""
    spec: dict[str, Any] = {
        "id": "m",
        "items": "plan",
        "element": "e",
        "call": step("draft", [{"var": "ctx"}, {"text": DRAFT}, {"var": "e"}], "d"),
        "then": [
            step("review", [{"var": "ctx"}, {"text": REVIEW}, {"var": "d"}], "r"),
            step("revise", [{"var": "ctx"}, {"text": REVISE}, {"var": "d"}, {"var": "r"}], "f"),
        ],
        "output": "results",
    }
    gets = [{"var": "results"}]
    if step_outputs:
        spec["step_outputs"] = ["drafts", "reviews"]
        gets += [{"var": "drafts"}, {"var": "reviews"}]
    frame = {
        "type": "submit",
        "id": "s",
        "vars": [{"id": "plan", "value": items}, {"id": "ctx", "value": "ctx!"}],
        "maps": [spec],
        "gets": gets,
    }
    frame.update(extra)
    return frame


def chain(element: str) -> tuple[str, str, str]:
    """What the scripted engine answers for the 3 steps of one element, made one by one."""
    draft = scripted_text(f"ctx!{DRAFT}{element}", 6)
    review = scripted_text(f"ctx!{REVIEW}{draft}", 6)
    return draft, review, scripted_text(f"ctx!{REVISE}{draft}{review}", 6)


async def test_each_element_runs_its_pipeline(client: RawClient, engine: ScriptedEngine) -> None:
    """Every element runs draft -> review -> revise; output holds the revisions, the step
    outputs the drafts and reviews, all in element order, from one submit."""
    elements = ["alpha", "beta", "gamma"]
    assert (await client.ask(steps_frame(json.dumps(elements))))["type"] == "ack"
    answers = await client.values(3)
    chains = [chain(e) for e in elements]
    assert json.loads(answers["results"]["text"]) == [c[2] for c in chains]
    assert json.loads(answers["drafts"]["text"]) == [c[0] for c in chains]
    assert json.loads(answers["reviews"]["text"]) == [c[1] for c in chains]
    assert len(engine.requests) == 9
    by_id = {r.request_id.rsplit("/", 2)[-2]: r for r in engine.requests}
    assert {"m#0", "m#0.1", "m#2.2"} <= set(by_id)
    groups = {r.group for r in engine.requests}
    assert len(groups) == 3  # one task group per step, across the elements


async def test_without_step_outputs_only_the_result(client: RawClient) -> None:
    """Step outputs are optional: the map's output alone, same values."""
    await client.ask(steps_frame('["x"]', step_outputs=False))
    answers = await client.values(1)
    assert json.loads(answers["results"]["text"]) == [chain("x")[2]]


async def test_an_empty_array_finishes_every_output(client: RawClient) -> None:
    """[]: no call, output and step outputs all `[]`."""
    await client.ask(steps_frame("[]"))
    answers = await client.values(3)
    assert {a["text"] for a in answers.values()} == {"[]"}


async def test_a_failed_step_fails_the_later_steps_and_the_map(make_server: ServerFactory) -> None:
    """Element 1's review fails: its revise never runs, the map and its step outputs fail,
    and the other element's pipeline, whose result nothing can use any more, is stopped."""
    engine = ScriptedEngine(fail_if=lambda r: r.request_id.endswith("m#1.1/0"))
    server = await make_server(engine)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.ask(steps_frame('["a", "b"]'))
        answers = await client.values(3)
    assert {a["code"] for a in answers.values()} == {"engine_error"}
    ran = {r.request_id.rsplit("/", 2)[-2] for r in engine.requests}
    assert "m#1.2" not in ran and "m#0.2" not in ran


async def test_a_step_runs_after_the_one_before_even_unread(
    client: RawClient, engine: ScriptedEngine
) -> None:
    """A step that reads only the element still waits for the step before it."""
    frame = steps_frame('["a"]', step_outputs=False)
    frame["maps"][0]["then"] = [step("alone", [{"text": "Alone "}, {"var": "e"}], "z")]
    await client.ask(frame)
    answers = await client.values(1)
    assert json.loads(answers["results"]["text"]) == [scripted_text("Alone a", 6)]
    assert [r.request_id.rsplit("/", 2)[-2] for r in engine.requests] == ["m#0", "m#0.1"]


async def test_instances_of_every_step_are_freed(server: Any, client: RawClient) -> None:
    """No instance call or variable of any step stays in the graph once the map is done."""
    await client.ask(steps_frame('["a", "b"]'))
    await client.values(3)
    (session,) = server.scheduler.snapshot()
    app = server.scheduler.app(session.session_id)
    assert app is not None
    assert not [v for v in app.graph.vars if "#" in v]
    assert not [n for n in app.graph.nodes if "#" in n]


def then_step(k: int, segments: list[dict[str, Any]], out: str) -> Any:
    return lambda f: f["maps"][0]["then"].__setitem__(k, step(f"t{k}", segments, out))


def shadow(frame: dict[str, Any]) -> None:
    """then[0]'s output, which then[1] reads, is also the name of a session variable."""
    frame["vars"].append({"id": "z", "value": "outer"})
    then_step(0, [{"var": "d"}], "z")(frame)
    then_step(1, [{"var": "z"}], "f")(frame)


@pytest.mark.parametrize(
    ("change", "code", "field"),
    [
        (  # a later step with two outputs
            lambda f: f["maps"][0]["then"][1]["segments"].append({"gen": "f2"}),
            "bad_request",
            "maps[0].then[1]",
        ),
        (  # the first step reads the review, a later step's output
            lambda f: f["maps"][0]["call"]["segments"].insert(0, {"var": "r"}),
            "bad_request",
            "maps[0].call",
        ),
        (then_step(0, [{"var": "r"}], "r"), "bad_request", "maps[0].then[0]"),  # its own
        (then_step(1, [{"var": "d"}], "d"), "bad_request", "maps[0].then[1]"),  # twice
        (then_step(0, [{"var": "d"}], "plan"), "bad_request", "maps[0].then[0]"),  # items
        (then_step(0, [{"var": "d"}], "e"), "bad_request", "maps[0].then[0]"),  # element
        (then_step(1, [{"var": "d"}], "results"), "bad_request", "maps[0].then[1]"),  # output
        (then_step(1, [{"var": "d"}], "drafts"), "bad_request", "maps[0].then[1]"),
        (shadow, "bad_request", "maps[0].then[0]"),
        (
            lambda f: f["maps"][0].update(step_outputs=["drafts"]),
            "bad_request",
            "maps[0].step_outputs",
        ),
        (lambda f: f["maps"][0].update(element="drafts"), "bad_request", "maps[0]"),
        (
            lambda f: f["maps"][0].update(then=[f["maps"][0]["then"][0]] * MAX_MAP_STEPS),
            "bad_request",
            "maps[0].then",
        ),
        (
            lambda f: f["maps"][0]["then"][0].update(model="other"),
            "unknown_model",
            "maps[0].then[0].model",
        ),
        (
            lambda f: f["maps"][0]["then"][0]["segments"].insert(0, {"var": "nope"}),
            "unknown_var",
            "maps[0]",
        ),
        (
            lambda f: f["maps"][0]["then"][0].update(template="{{x}}", segments=None),
            "bad_template",
            "maps[0].then[0].template",
        ),
    ],
)
async def test_a_bad_pipeline_is_refused_whole(
    client: RawClient, change: Any, code: str, field: str
) -> None:
    """Each staging error answers the submit with one error naming the step or field;
    nothing is added (the same ids are accepted right after)."""
    frame = steps_frame("[]")
    change(frame)
    answer = await client.ask(frame)
    assert (answer["type"], answer["code"], answer.get("field")) == ("error", code, field)
    assert (await client.ask(steps_frame('["z"]')))["type"] == "ack"


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"max_calls_per_session": 6}, "2 instances of 3 steps would exceed max_calls"),
        ({"max_vars_per_session": 10}, "2 instances of 3 steps would exceed max_vars"),
    ],
)
async def test_limits_count_every_step(
    make_server: ServerFactory, config: dict[str, int], needle: str
) -> None:
    """max_calls/max_vars count each step's calls and outputs: 2 elements x 3 steps."""
    engine = ScriptedEngine()
    server = await make_server(engine, **config)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.ask(steps_frame('["a", "b"]'))
        answers = await client.values(3)
    assert answers["results"]["code"] == "limit_exceeded"
    assert needle in answers["results"]["message"]
    assert engine.requests == []


def pipeline(num_steps: int, items: list[str], with_outputs: bool) -> Submit:
    """A map of ``num_steps`` steps, step k reading the element and step k-1's output."""
    calls = []
    for k in range(num_steps):
        reads = [{"var": "e"}] + ([{"var": f"o{k - 1}"}] if k else [])
        calls.append(step(f"c{k}", [{"text": f"step {k}:"}, *reads], f"o{k}", tokens=None))
    spec = {
        "id": "m",
        "items": "plan",
        "element": "e",
        "call": calls[0],
        "then": calls[1:],
        "output": "out",
        "step_outputs": [f"s{k}" for k in range(num_steps - 1)] if with_outputs else [],
    }
    return Submit.model_validate(
        {"vars": [{"id": "plan", "value": json.dumps(items)}], "maps": [spec]}
    )


def before(node_id: str) -> str | None:
    """The instance id of the step before ``node_id``'s (``m#3.2`` -> ``m#3.1`` -> ``m#3``)."""
    instance, _, k = node_id.partition(".")
    return None if not k else instance if k == "1" else f"{instance}.{int(k) - 1}"


@settings(max_examples=30, deadline=None)
@given(
    num_steps=st.integers(min_value=1, max_value=5),
    items=st.lists(st.text(alphabet="abc", max_size=3), max_size=5),
    with_outputs=st.booleans(),
)
def test_any_pipeline_expands_and_finishes_in_step_order(
    num_steps: int, items: list[str], with_outputs: bool
) -> None:
    """On the graph alone: per element, step k is queued only after step k-1 is done; the
    map's output is each element's last step, step outputs each earlier step, and every
    instance is freed at the end."""
    graph = Graph()
    staged = stage(graph, pipeline(num_steps, items, with_outputs), ServerConfig(), len)
    graph.add(staged.variables, staged.nodes)
    ready = graph.activate([graph.nodes["m"]])
    done: list[str] = []
    while ready:
        node = ready.pop(0)
        assert before(node.node_id) is None or before(node.node_id) in done
        prompt = "".join(
            s.text if hasattr(s, "text") else graph.vars[s.var].value or ""
            for s in node.segments
            if not hasattr(s, "gen")
        )
        graph.start(node)
        ready += graph.complete_output(node, node.outputs[0], f"<{prompt}>", None, None)
        done.append(node.node_id)
    assert len(done) == num_steps * len(items)
    results = []
    for element in items:
        text = element
        per_step = []
        for k in range(num_steps):
            text = f"<step {k}:{element}{text if k else ''}>"
            per_step.append(text)
        results.append(per_step)
    assert graph.nodes["m"].state is NodeState.DONE
    assert json.loads(graph.vars["out"].value or "") == [r[-1] for r in results]
    for k in range(num_steps - 1 if with_outputs else 0):
        assert json.loads(graph.vars[f"s{k}"].value or "") == [r[k] for r in results]
    assert not [v for v in graph.vars if "#" in v] and not [n for n in graph.nodes if "#" in n]


async def test_the_protocol_docs_example_runs(client: RawClient) -> None:
    """docs/protocol.md's map-steps frame, as printed, is accepted and answers both gets."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
    (block,) = [b for b in re.findall(r"```json\n(.*?)```", docs, re.DOTALL) if '"id": "team"' in b]
    assert (await client.ask(json.loads(block)))["type"] == "ack"
    answers = await client.values(2)
    assert len(json.loads(answers["finals"]["text"])) == 2
    assert len(json.loads(answers["drafts"]["text"])) == 2
