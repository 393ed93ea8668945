"""``plan-execute``: LangGraph's plan-and-execute as an ordinary StateGraph.

A planner writes numbered steps for a goal; a router fans out one ``Send`` per step to an
executor; a synthesizer answers from the results. Every node is an LCEL chain (prompt |
model | parser), so compiled, the whole graph runs on the server with one client cut: the
router, which reads the plan. A run therefore costs two client frames whatever the number
of steps (``details['client frames']``); the stock way costs one round trip per call.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from eclectus.recipes.graphs import frame_details, prepare_graph
from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory
from eclectus.recipes.text import split_chunks

PLANNER = "You plan work. Break the goal into short, numbered steps, one per line."
plan_prompt = ChatPromptTemplate.from_messages([("system", PLANNER), ("human", "Goal:\n{goal}")])
step_prompt = ChatPromptTemplate.from_messages(
    [
        ("system", "You carry out one step of a plan. The goal:\n{goal}"),
        ("human", "Carry out this step and report the result: {step}"),
    ]
)
answer_prompt = ChatPromptTemplate.from_messages(
    [
        ("system", "You write the final answer from the results of a plan's steps."),
        ("human", "Goal:\n{goal}\n\nResults:\n{results}\n\nWrite the answer."),
    ]
)
STEP_LINE = re.compile(r"^\s*(?:\d+[.)]|[-*])\s*(.+?)\s*$")


class PlanState(TypedDict, total=False):
    goal: str
    plan: str
    results: Annotated[list[str], operator.add]
    answer: str


@dataclass(frozen=True, slots=True)
class PlanExecuteParams:
    """Sizes of a run (tokens are the model's; see text.approx_tokens)."""

    steps: int = 6  # the fan-out: executors per run
    goal_tokens: int = 256  # the input document's head, as the goal
    plan_tokens: int = 96
    step_tokens: int = 64
    answer_tokens: int = 96

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def plan_steps(plan: str, count: int) -> list[str]:
    """The first ``count`` steps of the plan (numbered or bulleted lines, else any line),
    padded with ``step N`` when it has fewer (a random model writes none). Pure."""
    lines = [m.group(1) for line in plan.splitlines() if (m := STEP_LINE.match(line))]
    lines = (lines or [line.strip() for line in plan.splitlines() if line.strip()])[:count]
    return lines + [f"step {i + 1}" for i in range(len(lines), count)]


def build_app(params: PlanExecuteParams, models: ModelFactory) -> Any:
    """The StateGraph, compiled by LangGraph (pure)."""

    def fan_out(state: PlanState) -> list[Send]:
        steps = plan_steps(state["plan"], params.steps)
        return [Send("execute", {"goal": state["goal"], "step": step}) for step in steps]

    planner = plan_prompt | models.chat(params.plan_tokens) | StrOutputParser()
    return plan_graph(PlanState, planner, fan_out, models, params.step_tokens, params.answer_tokens)


def plan_graph(
    state: type,
    planner: Runnable,
    fan_out: Any,
    models: ModelFactory,
    step: int,
    answer: int,
    triage: tuple[Runnable, Runnable] | None = None,
) -> Any:
    """plan (``planner``, the goal in, ``state["plan"]`` out) -> ``fan_out`` (a router
    sending each step to "execute") -> one executor per step (``step`` tokens) -> the
    synthesizer (``answer`` tokens), compiled by LangGraph; shared with plan-execute-json
    (pure). ``triage``: (a router writing ``state["style"]``, "brief" or "detailed"; a
    second planner): a supervisor first routes the goal to the planner of that style."""
    parser = StrOutputParser()
    execute = step_prompt | models.chat(step) | parser | (lambda r: [r])
    builder = StateGraph(state)
    builder.add_node("plan", {"plan": planner})
    builder.add_node("execute", {"results": execute})
    builder.add_node("synthesize", {"answer": answer_prompt | models.chat(answer) | parser})
    if triage is None:
        builder.add_edge(START, "plan")
    else:
        router, detailed = triage
        builder.add_node("triage", {"style": router})
        builder.add_node("plan_detailed", {"plan": detailed})
        builder.add_edge(START, "triage")
        styles = {"brief": "plan", "detailed": "plan_detailed"}
        builder.add_conditional_edges("triage", lambda s: s["style"], styles)
        builder.add_conditional_edges("plan_detailed", fan_out, ["execute"])
    builder.add_conditional_edges("plan", fan_out, ["execute"])
    builder.add_edge("execute", "synthesize")
    builder.add_edge("synthesize", END)
    return builder.compile()


def plan(params: PlanExecuteParams, text: str) -> int:
    """Planned model calls: the plan, one per step, the answer."""
    return params.steps + 2


def run(
    params: PlanExecuteParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Plan, execute and answer for the head of ``text`` as the goal."""
    app = prepare_graph(models, build_app(params, models), "plan-execute")
    return run_plan_graph(app, params.goal_tokens, params.steps + 2, text, config)


def run_plan_graph(
    app: Any, goal_tokens: int, calls: int, text: str, config: RunnableConfig, depth: int = 3
) -> RecipeOutput:
    """Run a plan graph (:func:`plan_graph`) for the head of ``text`` as the goal."""
    goal = split_chunks(text, goal_tokens, 1)[0]
    state = app.invoke({"goal": goal}, config)
    details = {"steps": len(state["results"]), **frame_details(app, calls)}
    if "style" in state:  # the triage router's pick
        details = {"style": state["style"], **details}
    return RecipeOutput(state["answer"], depth, calls, details)
