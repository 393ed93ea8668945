"""The graph shapes of LangGraph's docs, built over one ChatEclectus: each function returns
a compiled StateGraph (``builder.compile()``) and an input for it."""

from __future__ import annotations

import operator
import warnings
from enum import StrEnum
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Send
from pydantic import BaseModel, Field, create_model

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langgraph import EagerFallbackWarning, SendEach, compile


def run_compiled(app: Any, value: Any) -> tuple[Any, Any]:
    """``app`` compiled and run on ``value``: the compiled graph and its output state. A
    fallback to eager LangGraph (EagerFallbackWarning) is an error: the run is the server's."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        compiled = compile(app)
        return compiled, compiled.invoke(value)


def text(model: ChatEclectus, template: str) -> Any:
    """prompt | model | parser: one model call producing text."""
    return PromptTemplate.from_template(template) | model | StrOutputParser()


class Pipeline(TypedDict, total=False):
    topic: str
    draft: str
    loud: str
    final: str


def sequential(model: ChatEclectus) -> tuple[Any, dict[str, Any]]:
    """START -> write -> refine -> END, both LCEL nodes."""
    builder = StateGraph(Pipeline)
    builder.add_node("write", {"draft": text(model, "Write about {topic}:")})
    builder.add_node("refine", {"final": text(model, "Improve this: {draft}\nBetter:")})
    builder.add_edge(START, "write")
    builder.add_edge("write", "refine")
    builder.add_edge("refine", END)
    return builder.compile(), {"topic": "tides"}


def python_in_the_middle(model: ChatEclectus) -> tuple[Any, dict[str, Any]]:
    """write (LCEL) -> shout (a Python function) -> refine (LCEL)."""

    def shout(state: Pipeline) -> dict[str, str]:
        return {"loud": state["draft"].upper()}

    builder = StateGraph(Pipeline)
    builder.add_node("write", {"draft": text(model, "Write about {topic}:")})
    builder.add_node("shout", shout)
    builder.add_node("refine", {"final": text(model, "Improve: {loud} / {draft}\nBetter:")})
    builder.add_edge(START, "write")
    builder.add_edge("write", "shout")
    builder.add_edge("shout", "refine")
    builder.add_edge("refine", END)
    return builder.compile(), {"topic": "moons"}


class Jokes(TypedDict, total=False):
    topic: str
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]
    best: str


class JokeTask(TypedDict):
    subject: str


def map_reduce(model: ChatEclectus, width: int = 3) -> tuple[Any, dict[str, Any]]:
    """LangGraph's map-reduce: subjects -> Send one joke per subject -> pick the best."""

    def subjects(state: Jokes) -> dict[str, list[str]]:
        return {"subjects": [f"{state['topic']} #{i}" for i in range(width)]}

    def fan_out(state: Jokes) -> list[Send]:
        return [Send("joke", {"subject": s}) for s in state["subjects"]]

    builder = StateGraph(Jokes)
    builder.add_node("subjects", subjects)
    builder.add_node("joke", {"jokes": text(model, "A joke about {subject}:") | (lambda j: [j])})
    builder.add_node("best", {"best": text(model, "Jokes: {jokes}\nThe best one:")})
    builder.add_edge(START, "subjects")
    builder.add_conditional_edges("subjects", fan_out, ["joke"])
    builder.add_edge("joke", "best")
    builder.add_edge("best", END)
    return builder.compile(), {"topic": "owls"}


class PlanState(TypedDict, total=False):
    goal: str
    plan: str
    results: Annotated[list[str], operator.add]
    answer: str


class StepTask(TypedDict):
    goal: str
    step: str


def plan_execute(model: ChatEclectus, max_steps: int = 3) -> tuple[Any, dict[str, Any]]:
    """planner (LCEL) -> one executor per planned step (Send) -> synthesizer (LCEL)."""

    def steps(state: PlanState) -> list[Send]:
        lines = [w for w in state["plan"].split() if w][:max_steps] or ["finish"]
        return [Send("execute", {"goal": state["goal"], "step": line}) for line in lines]

    builder = StateGraph(PlanState)
    builder.add_node("plan", {"plan": text(model, "Goal: {goal}\nSteps:")})
    execute = text(model, "Goal: {goal}\nDo the step: {step}\nResult:") | (lambda r: [r])
    builder.add_node("execute", {"results": execute})
    builder.add_node(
        "synthesize", {"answer": text(model, "Goal: {goal}\nResults: {results}\nAnswer:")}
    )
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", steps, ["execute"])
    builder.add_edge("execute", "synthesize")
    builder.add_edge("synthesize", END)
    return builder.compile(), {"goal": "tidy the shed"}


class Team(TypedDict, total=False):
    task: str
    note: str
    log: Annotated[list[str], operator.add]


def supervisor(model: ChatEclectus, rounds: int = 2) -> tuple[Any, dict[str, Any]]:
    """A supervisor (LCEL) routes to one of two workers (LCEL) until the log is full."""

    def route(state: Team) -> str:
        if len(state.get("log", [])) >= rounds:
            return END
        return "researcher" if len(state["note"]) % 2 == 0 else "writer"

    builder = StateGraph(Team)
    builder.add_node("supervisor", {"note": text(model, "Task: {task}\nSo far: {log}\nNext:")})
    for name in ("researcher", "writer"):
        worker = text(model, f"As the {name}, on {{task}} given {{note}}:") | (lambda r: [r])
        builder.add_node(name, {"log": worker})
        builder.add_edge(name, "supervisor")
    builder.add_edge(START, "supervisor")
    builder.add_conditional_edges("supervisor", route, ["researcher", "writer", END])
    return builder.compile(), {"task": "a bridge", "log": []}


def chat_agent(model: ChatEclectus) -> tuple[Any, dict[str, Any]]:
    """MessagesState with add_messages: two chat turns by LCEL nodes."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be brief."), MessagesPlaceholder("messages")]
    )
    builder = StateGraph(MessagesState)
    builder.add_node("first", prompt | model | (lambda m: {"messages": [m]}))
    builder.add_node("second", prompt | model | (lambda m: {"messages": [m]}))
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(), {"messages": [("human", "hi there")]}


def plan_model(width: int) -> type[BaseModel]:
    """A plan of exactly ``width`` steps (JSON Schema minItems = maxItems = width)."""
    steps = Annotated[list[str], Field(min_length=width, max_length=width)]
    return create_model("Plan", steps=(steps, ...))


class ConstrainedPlan(TypedDict, total=False):
    goal: str
    plan: Any
    results: Annotated[list[str], operator.add]
    answer: str


def constrained_plan_execute(
    model: ChatEclectus, width: int = 3, schema: Any = None, fan_out: Any = None
) -> tuple[Any, dict[str, Any]]:
    """plan-and-execute whose planner is constrained to a JSON plan (``with_structured_output``)
    and whose router is a SendEach over its steps: compiled, a server-side map."""
    planner_model = model.model_copy(update={"max_tokens": 24 * width + 16})
    planner = PromptTemplate.from_template("Goal: {goal}\nPlan:") | (
        planner_model.with_structured_output(schema or plan_model(width))
    )
    builder = StateGraph(ConstrainedPlan)
    builder.add_node("plan", {"plan": planner})
    execute = text(model, "Goal: {goal}\nDo the step: {step}\nResult:") | (lambda r: [r])
    builder.add_node("execute", {"results": execute})
    builder.add_node(
        "synthesize", {"answer": text(model, "Goal: {goal}\nResults: {results}\nAnswer:")}
    )
    builder.add_edge(START, "plan")
    fan_out = fan_out or SendEach("execute", "plan", key="step", path=["steps"], keep=["goal"])
    builder.add_conditional_edges("plan", fan_out, ["execute"])
    builder.add_edge("execute", "synthesize")
    builder.add_edge("synthesize", END)
    return builder.compile(), {"goal": "tidy the shed"}


class Routed(TypedDict, total=False):
    task: str
    next: str
    log: Annotated[list[str], operator.add]


ROUTES = ("research", "write")


def constrained_supervisor(model: ChatEclectus, rounds: int = 3) -> tuple[Any, dict[str, Any]]:
    """A supervisor whose reply is constrained to one of two literals (a ``choice``
    constraint through ``extra_body``) and a conditional edge mapping it to a worker, until
    the log is full."""
    chooser = model.model_copy(update={"max_tokens": 8}).bind(
        extra_body={"structured_outputs": {"choice": list(ROUTES)}}
    )
    supervisor = PromptTemplate.from_template("Task: {task}\nLog: {log}\nNext:") | chooser
    builder = StateGraph(Routed)
    builder.add_node("supervisor", {"next": supervisor | StrOutputParser()})
    for name in ROUTES:
        worker = text(model, f"As the {name}er, on {{task}}:") | (lambda r: [r])
        builder.add_node(name, {"log": worker})
        builder.add_edge(name, "supervisor")

    def route(state: Routed) -> str:
        return "done" if len(state["log"]) >= rounds else state["next"]  # a literal

    builder.add_edge(START, "supervisor")
    builder.add_conditional_edges(
        "supervisor", route, {"research": "research", "write": "write", "done": END}
    )
    return builder.compile(), {"task": "a bridge", "log": []}


class RoutedTask(TypedDict, total=False):
    task: str
    next: str
    answer: str
    review: str


PICKS = ("research", "write", "FINISH")


def routed_supervisor(
    model: ChatEclectus, routes: tuple[str, ...] = PICKS, task: str = "a bridge"
) -> tuple[Any, dict[str, Any]]:
    """A supervisor whose router is constrained to a choice of literals picks one worker (or
    finishes); the worker's answer is then reviewed. The edge maps each literal to a node."""
    router = model.bind(extra_body={"structured_outputs": {"choice": list(routes)}})
    pick = PromptTemplate.from_template("Task: {task}\nWho acts next?") | router | StrOutputParser()
    return _supervised(model, {"next": pick}, routes), {"task": task}


def structured_supervisor(
    model: ChatEclectus,
    routes: tuple[str, ...] = PICKS,
    task: str = "a bridge",
    router_schema: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """The supervisor as LangGraph's docs write it: the router node is
    ``prompt | model.with_structured_output(Router)``, ``Router`` a TypedDict whose ``next``
    is a ``Literal`` of the routes; its dict output is merged into the state and the
    conditional edge reads ``next``."""
    router_type = router_schema
    if router_type is None:  # class Router(TypedDict): next: Literal[*routes]
        router_type = TypedDict("Router", {"next": Literal[routes]})  # type: ignore[operator,misc]  # noqa: UP013
        router_type.__doc__ = "Who acts next."
    router_model = model.model_copy(update={"max_tokens": 24})
    pick = PromptTemplate.from_template("Task: {task}\nWho acts next?") | (
        router_model.with_structured_output(router_type)
    )
    return _supervised(model, pick, routes), {"task": task}


class ModelRoutedTask(TypedDict, total=False):
    task: str
    route: BaseModel
    answer: str
    review: str


class Pick(StrEnum):
    """PICKS as an enum, for routers whose field is one."""

    RESEARCH = "research"
    WRITE = "write"
    FINISH = "FINISH"


class EnumRoute(BaseModel):
    """Who acts next."""

    next: Pick


def route_model(routes: tuple[str, ...] = PICKS, **fields: Any) -> type[BaseModel]:
    """``class Route(BaseModel): next: Literal[*routes]``, with ``fields`` besides."""
    return create_model(  # type: ignore[call-overload,no-any-return]
        "Route", __doc__="Who acts next.", next=(Literal[routes], ...), **fields
    )


def model_supervisor(
    model: ChatEclectus,
    routes: tuple[str, ...] = PICKS,
    task: str = "a bridge",
    route_cls: type[BaseModel] | None = None,
    edge: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """The supervisor with a Pydantic router whose model the node writes whole to ``route``
    (``{"route": prompt | model.with_structured_output(Route)}``); the conditional edge
    reads ``s["route"].next`` (or runs ``edge``)."""
    router_model = model.model_copy(update={"max_tokens": 24})
    pick = PromptTemplate.from_template("Task: {task}\nWho acts next?") | (
        router_model.with_structured_output(route_cls or route_model(routes))
    )
    edge = edge or (lambda s: s["route"].next)
    return _supervised(model, {"route": pick}, routes, ModelRoutedTask, edge), {"task": task}


def _supervised(
    model: ChatEclectus,
    supervisor: Any,
    routes: tuple[str, ...],
    state: type = RoutedTask,
    edge: Any = None,
) -> Any:
    """The graph the supervisors share: ``supervisor`` sets ``next`` (or what ``edge``
    reads); ``routes[0]`` goes to the researcher, ``routes[1]`` to the writer (each then
    reviewed), ``routes[2]`` ends."""
    builder = StateGraph(state)
    builder.add_node("supervisor", supervisor)
    builder.add_node("researcher", {"answer": text(model, "Research {task}:")})
    builder.add_node("writer", {"answer": text(model, "Write about {task}:")})
    builder.add_node("review", {"review": text(model, "Review: {answer}\nVerdict:")})
    builder.add_edge(START, "supervisor")
    ends = {routes[0]: "researcher", routes[1]: "writer", routes[2]: END}
    builder.add_conditional_edges("supervisor", edge or (lambda s: s["next"]), ends)
    builder.add_edge("researcher", "review")
    builder.add_edge("writer", "review")
    builder.add_edge("review", END)
    return builder.compile()
