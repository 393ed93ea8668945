"""A planner constrained to a JSON list, fanned out with ``SendEach``: compiled, the fan-out
is a server-side map (no client round trip, one frame per run whatever the width), and the
run equals the eager one under greedy decoding; where the compiler cannot prove the map
exact it falls back to the client cut, still equal."""

from __future__ import annotations

from typing import Annotated, Any

import lg_graphs
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langgraph.types import Send
from pydantic import BaseModel, Field, field_validator

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import SendEach, compile
from eclectus.server.front.app import EclectusServer


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


def mapped(compiled: Any) -> bool:
    return "map over plan.steps" in compiled.last_graph.render()


@pytest.mark.parametrize("width", [1, 3, 6])
def test_constrained_plan_maps_on_the_server(chat: ChatEclectus, width: int) -> None:
    """compiled == eager, the fan-out is a map, and a run is one frame for any width."""
    app, value = lg_graphs.constrained_plan_execute(chat, width)
    compiled, out = lg_graphs.run_compiled(app, value)
    assert out == app.invoke(value)
    assert len(out["results"]) == width
    assert mapped(compiled) and compiled.last_frames == 1
    assert compiled.last_graph.cuts == []


@pytest.mark.parametrize("mode", ["values", "updates", ["updates", "values"]])
def test_constrained_plan_streams(chat: ChatEclectus, mode: Any) -> None:
    """The streams give LangGraph's chunks: one ``updates`` chunk per mapped task."""
    app, value = lg_graphs.constrained_plan_execute(chat, 3)
    eager = list(app.stream(value, stream_mode=mode))
    compiled = list(compile(app).stream(value, stream_mode=mode))
    if mode != "values":  # Send tasks finish in any order eagerly
        eager, compiled = sorted(map(repr, eager)), sorted(map(repr, compiled))
    assert compiled == eager


def test_a_json_dict_plan_maps_too(chat: ChatEclectus) -> None:
    """A dict JSON Schema (JsonOutputParser) maps like a Pydantic one."""
    schema = {
        "title": "plan",
        "type": "object",
        "properties": {"steps": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
        "required": ["steps"],
    }
    app, value = lg_graphs.constrained_plan_execute(chat, 2, schema=schema)
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    assert mapped(compiled) and compiled.last_frames == 1


def test_a_pattern_bounded_list_maps_too(chat: ChatEclectus) -> None:
    """Items bounded by a regex ``pattern`` (file names, say) are still plain strings."""
    item = {"type": "string", "pattern": "^[a-z_]{1,8}\\.py$"}
    schema = {
        "title": "plan",
        "type": "object",
        "properties": {"steps": {"type": "array", "items": item, "minItems": 2, "maxItems": 2}},
        "required": ["steps"],
    }
    app, value = lg_graphs.constrained_plan_execute(chat, 2, schema=schema)
    compiled = compile(app)
    out = compiled.invoke(value)
    assert out == app.invoke(value)
    assert mapped(compiled) and compiled.last_frames == 1


class MaybeEmpty(BaseModel):
    steps: list[str] = Field(max_length=2)


class Stripped(BaseModel):
    steps: Annotated[list[str], Field(min_length=2, max_length=2)]

    @field_validator("steps")
    @classmethod
    def strip(cls, steps: list[str]) -> list[str]:
        return [s.strip() for s in steps]


@pytest.mark.parametrize("schema", [MaybeEmpty, Stripped], ids=["may-be-empty", "validator"])
def test_unprovable_maps_fall_back_to_the_cut(chat: ChatEclectus, schema: type) -> None:
    """A list that may be empty (no step would run eagerly) or a parser that changes items:
    the router runs on the client (two frames), the result is still the eager one."""
    app, value = lg_graphs.constrained_plan_execute(chat, 2, schema=schema)
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    assert not mapped(compiled) and compiled.last_frames == 2


def test_a_python_router_is_a_cut(chat: ChatEclectus) -> None:
    """The same fan-out as a plain function: a client cut, same result."""

    def fan_out(state: dict[str, Any]) -> list[Send]:
        return [Send("execute", {"goal": state["goal"], "step": s}) for s in state["plan"].steps]

    app, value = lg_graphs.constrained_plan_execute(chat, 2, fan_out=fan_out)
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    assert not mapped(compiled) and compiled.last_frames == 2


class Recorder(BaseCallbackHandler):
    """Each call's (prompt, reply), as the handler saw them."""

    def __init__(self) -> None:
        self.prompts: dict[Any, str] = {}
        self.calls: list[tuple[str, str]] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **_: Any) -> None:
        self.prompts[run_id] = repr(messages)

    def on_llm_end(self, response: Any, *, run_id: Any, **_: Any) -> None:
        self.calls.append((self.prompts[run_id], response.generations[0][0].text))


def test_callbacks_fire_for_every_mapped_call(chat: ChatEclectus) -> None:
    """With a callback handler the fan-out is still a map, and each of its calls fires
    start and end with the messages and the reply the eager Send task's call has."""
    app, value = lg_graphs.constrained_plan_execute(chat, 3)
    eager, fast = Recorder(), Recorder()
    expected = app.invoke(value, {"callbacks": [eager]})
    compiled = compile(app)
    assert compiled.invoke(value, {"callbacks": [fast]}) == expected
    assert len(fast.calls) == len(eager.calls) == 5
    assert sorted(fast.calls) == sorted(eager.calls)
    assert mapped(compiled) and compiled.last_frames == 1


def test_send_each_runs_eagerly() -> None:
    """SendEach is an ordinary router: it returns the Sends LangGraph runs."""
    fan = SendEach("work", "plan", key="step", path=["steps"], keep=["goal"])
    sends = fan({"goal": "g", "plan": {"steps": ["a", "b"]}})
    assert [(s.node, s.arg) for s in sends] == [
        ("work", {"goal": "g", "step": "a"}),
        ("work", {"goal": "g", "step": "b"}),
    ]


def test_explain_says_the_edge_can_map(chat: ChatEclectus) -> None:
    app, value = lg_graphs.constrained_plan_execute(chat, 2)
    compiled = compile(app)
    compiled.invoke(value)
    text = compiled.explain()
    assert "plan -> ? (send_each_execute): server map" in text
    assert "last run: 1 client frame(s)" in text


def test_a_constrained_router_equals_eager(chat: ChatEclectus) -> None:
    """A supervisor whose reply is one of N literals (choice constraint) routes exactly as
    eagerly; its call runs on the server, the routing function is evaluated and the literal
    it returns is fetched (one frame per decision: the workers loop back to the router, so
    no server switch, and the router reads the log)."""
    app, value = lg_graphs.constrained_supervisor(chat)
    compiled = compile(app)
    out = compiled.invoke(value)
    assert out == app.invoke(value)
    assert out["next"] in lg_graphs.ROUTES
    trace = compiled.last_graph
    assert trace is not None and not trace.cuts
    assert "'choice'" in trace.render() and "route: evaluated" in trace.render()
    assert len(out["log"]) == 3 and trace.num_calls == 7  # 4 routing calls, 3 workers
    assert compiled.last_frames == 4
    updates = list(compiled.stream(value, stream_mode="updates"))
    assert updates == list(app.stream(value, stream_mode="updates"))
