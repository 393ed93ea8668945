"""A ``SendEach`` fan-out to a worker that makes several calls (draft, review, revise, each
reading the earlier replies): compiled, the fan-out is one server map whose instances are
pipelines of calls (no client round trip, one frame per run), the run equals the eager one
under greedy decoding, callbacks fire for every call; what cannot map falls back to the
client cut, still equal."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import lg_graphs
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough, RunnablePick
from langgraph.graph import END, START, StateGraph

from eclectus.adapters.client.declarations import Declarations
from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import SendEach, compile
from eclectus.protocol import MAX_MAP_STEPS
from eclectus.server.front.app import EclectusServer


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


class Team(TypedDict, total=False):
    goal: str
    style: str
    plan: Any
    results: Annotated[list[Any], operator.add]
    answer: str


DRAFT = "Goal: {goal}\nDraft for {step}:"
REVIEW = "Review the draft for {step}: {draft}\nReview:"
REVISE = "Goal: {goal}\n{step}: {draft}\nReview: {review}\nFinal:"


def worker(model: ChatEclectus, rounds: int = 1, pick: Any = "final") -> Runnable:
    """draft, then per round a review and a revision, each reading the earlier replies;
    ``pick`` is what the node writes, packed in a list (pure)."""
    chain: Runnable = RunnablePassthrough.assign(draft=lg_graphs.text(model, DRAFT))
    for _ in range(rounds):
        chain = chain | RunnablePassthrough.assign(review=lg_graphs.text(model, REVIEW))
        chain = chain | RunnablePassthrough.assign(final=lg_graphs.text(model, REVISE))
        chain = chain | RunnablePassthrough.assign(draft=RunnablePick("final"))
    return chain | RunnablePick(pick) | (lambda r: [r])


def team(
    model: ChatEclectus, width: int, work: Runnable, triage: bool = False
) -> tuple[Any, dict[str, Any]]:
    """A constrained planner, a SendEach to ``work`` per step, a synthesizer; with
    ``triage``, a router constrained to a choice first picks one of two planners (pure)."""
    planner_model = model.model_copy(update={"max_tokens": 24 * width + 16})
    schema = lg_graphs.plan_model(width)
    builder = StateGraph(Team)
    for name, template in [("plan", "Goal: {goal}\nPlan:"), ("plan_b", "Goal: {goal}\nSteps:")]:
        prompt = PromptTemplate.from_template(template)
        builder.add_node(name, {"plan": prompt | planner_model.with_structured_output(schema)})
        fan_out = SendEach("work", "plan", key="step", path=["steps"], keep=["goal"])
        builder.add_conditional_edges(name, fan_out, ["work"])
    builder.add_node("work", {"results": work})
    builder.add_node(
        "synthesize", {"answer": lg_graphs.text(model, "Goal: {goal}\nResults: {results}\nDone:")}
    )
    if triage:
        choice = {"structured_outputs": {"choice": ["a", "b"]}}
        router = lg_graphs.text(model.bind(extra_body=choice), "Goal: {goal}\na or b?")
        builder.add_node("triage", {"style": router})
        builder.add_edge(START, "triage")
        builder.add_conditional_edges("triage", lambda s: s["style"], {"a": "plan", "b": "plan_b"})
    else:
        builder.add_edge(START, "plan")
    builder.add_edge("work", "synthesize")
    builder.add_edge("synthesize", END)
    return builder.compile(), {"goal": "tidy the shed"}


def mapped(compiled: Any, calls: int) -> bool:
    return f"map over plan.steps: a pipeline of {calls} calls" in compiled.last_graph.render()


@pytest.mark.parametrize(("width", "rounds"), [(1, 1), (3, 1), (2, 2)])
def test_a_multi_call_worker_maps_on_the_server(
    chat: ChatEclectus, width: int, rounds: int
) -> None:
    """compiled == eager; the fan-out is one map of (1 + 2 rounds)-call pipelines; one
    frame, no cut, whatever the width."""
    app, value = team(chat, width, worker(chat, rounds))
    compiled, out = lg_graphs.run_compiled(app, value)
    assert out == app.invoke(value)
    assert len(out["results"]) == width
    assert mapped(compiled, 1 + 2 * rounds)
    assert compiled.last_frames == 1 and compiled.last_graph.cuts == []


def test_a_pipeline_map_streams_as_eager(chat: ChatEclectus) -> None:
    """One ``updates`` chunk per mapped task, each its last call's reply."""
    app, value = team(chat, 3, worker(chat))
    eager = sorted(map(repr, app.stream(value, stream_mode="updates")))
    assert sorted(map(repr, compile(app).stream(value, stream_mode="updates"))) == eager


class Recorder(BaseCallbackHandler):
    """Each call's (prompt, reply), in the order the handler saw them end."""

    def __init__(self) -> None:
        self.prompts: dict[Any, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.texts: list[str] = []  # the first message's text of each call, in start order

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **_: Any) -> None:
        self.prompts[run_id] = repr(messages)
        self.texts.append(messages[0][0].text)

    def on_llm_end(self, response: Any, *, run_id: Any, **_: Any) -> None:
        self.calls.append((self.prompts[run_id], response.generations[0][0].text))


def test_callbacks_fire_for_every_step_of_every_item(chat: ChatEclectus) -> None:
    """With a handler the fan-out still maps; every call of every instance fires start and
    end with the messages and reply its eager twin has, each item's calls in order."""
    app, value = team(chat, 3, worker(chat))
    eager, fast = Recorder(), Recorder()
    expected = app.invoke(value, {"callbacks": [eager]})
    compiled = compile(app)
    assert compiled.invoke(value, {"callbacks": [fast]}) == expected
    assert len(fast.calls) == len(eager.calls) == 1 + 3 * 3 + 1
    assert sorted(fast.calls) == sorted(eager.calls)
    assert mapped(compiled, 3) and compiled.last_frames == 1
    kinds = [_kind(text) for text in fast.texts]
    assert [k for k in kinds if k != "other"] == ["draft", "review", "revise"] * 3


def test_a_pipeline_map_inside_a_server_switch(chat: ChatEclectus) -> None:
    """Behind a router constrained to a choice, each branch's pipeline map is declared
    (guarded by the switch) and only the taken one runs: compiled == eager, one frame,
    and callbacks for the taken branch's calls only, as eagerly."""
    app, value = team(chat, 2, worker(chat), triage=True)
    eager, fast = Recorder(), Recorder()
    expected = app.invoke(value, {"callbacks": [eager]})
    compiled = compile(app)
    assert compiled.invoke(value, {"callbacks": [fast]}) == expected
    assert sorted(fast.calls) == sorted(eager.calls) and len(fast.calls) == 1 + 1 + 2 * 3 + 1
    render = compiled.last_graph.render()
    assert "switch on 'style'" in render and mapped(compiled, 3)
    assert compiled.last_frames == 1


def test_step_outputs_only_for_handlers(
    chat: ChatEclectus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The earlier steps' replies are declared (and fetched) only when a handler wants the
    calls: a run without callbacks asks the map for its result alone."""
    asked: list[bool] = []
    real = Declarations.map_pipeline

    def spy(self: Any, *args: Any, step_outputs: bool = False, **kwargs: Any) -> Any:
        asked.append(step_outputs)
        return real(self, *args, step_outputs=step_outputs, **kwargs)

    monkeypatch.setattr(Declarations, "map_pipeline", spy)
    app, value = team(chat, 2, worker(chat))
    compiled = compile(app)
    compiled.invoke(value)
    compiled.invoke(value, {"callbacks": [Recorder()]})
    assert asked == [False, True]


async def test_callbacks_fire_for_every_step_async(chat: ChatEclectus) -> None:
    """The same through ``ainvoke``: the async callback managers see every call."""
    app, value = team(chat, 2, worker(chat, rounds=2))
    eager, fast = Recorder(), Recorder()
    expected = await app.ainvoke(value, {"callbacks": [eager]})
    compiled = compile(app)
    assert await compiled.ainvoke(value, {"callbacks": [fast]}) == expected
    assert len(fast.calls) == len(eager.calls) == 1 + 2 * 5 + 1
    assert sorted(fast.calls) == sorted(eager.calls)
    assert mapped(compiled, 5) and compiled.last_frames == 1


def _kind(text: str) -> str:
    """Which template a worker call's prompt came from (pure)."""
    if text.startswith("Goal: tidy the shed\nDraft for "):
        return "draft"
    if text.startswith("Review the draft for "):
        return "review"
    return "revise" if text.endswith("\nFinal:") else "other"


def _shout(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "draft": value["draft"].upper()}


@pytest.mark.parametrize(
    "shape",
    ["earlier-reply", "python-step", "dict-write", "too-many-calls"],
)
def test_unmappable_workers_fall_back_to_the_cut(chat: ChatEclectus, shape: str) -> None:
    """A worker writing an earlier call's reply, with a Python step between its calls,
    writing a dict, or making more calls than a map may: the router runs on the client
    (one more frame, and one per cut after it), the result is still the eager one."""
    work: Runnable
    if shape == "earlier-reply":
        work = worker(chat, pick="review")
    elif shape == "python-step":
        draft = RunnablePassthrough.assign(draft=lg_graphs.text(chat, DRAFT))
        review = RunnablePassthrough.assign(review=lg_graphs.text(chat, REVIEW))
        work = draft | RunnableLambda(_shout) | review | RunnablePick("review") | (lambda r: [r])
    elif shape == "dict-write":
        work = worker(chat) | (lambda r: [{"code": r[0]}])
    else:
        one = chat.model_copy(update={"max_tokens": 1})
        work = RunnablePassthrough.assign(draft=lg_graphs.text(one, DRAFT))
        for _ in range(MAX_MAP_STEPS):
            work = work | RunnablePassthrough.assign(draft=lg_graphs.text(one, REVIEW))
        work = work | RunnablePick("draft") | (lambda r: [r])
    app, value = team(chat, 2, work)
    compiled = compile(app)
    assert compiled.invoke(value) == app.invoke(value)
    trace = compiled.last_graph
    assert "map over" not in trace.render()
    assert "send_each_work" in [name for name, _ in trace.cuts]
    assert compiled.last_frames == len(trace.cuts) + 1
