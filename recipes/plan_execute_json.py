"""``plan-execute-json``: ``plan-execute`` with a constrained plan, fanned out on the server.

A planner writes the steps for a goal as JSON (``with_structured_output``: the reply is
constrained to ``{"steps": [exactly N strings]}``); a router (``SendEach``) fans out one
``Send`` per step to an executor; a synthesizer answers from the results. Every node is an
LCEL chain, and the plan is valid by construction, so compiled, the whole graph runs on the
server: the fan-out is a server-side map over the plan, with no client cut. A run costs one
client frame whatever the number of steps (``details['client frames']``); the stock way
costs one round trip per call. (``plan-execute`` is the same app with a text plan and a
Python router: two client frames.)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableConfig

from eclectus.adapters.langgraph.fanout import SendEach
from eclectus.recipes.graphs import list_schema, prepare_graph
from eclectus.recipes.plan_execute import plan_graph, run_plan_graph
from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory

PLANNER = 'You plan work. Break the goal into short steps. Reply with JSON: {{"steps": [...]}}.'
plan_prompt = ChatPromptTemplate.from_messages([("system", PLANNER), ("human", "Goal:\n{goal}")])
DETAILED = (
    "You plan work in detail: each step one concrete action. " + PLANNER[len("You plan work. ") :]
)
detailed_prompt = ChatPromptTemplate.from_messages(
    [("system", DETAILED), ("human", "Goal:\n{goal}")]
)
TRIAGE = "You run a planning desk. Does this goal need a brief plan or a detailed one?"
triage_prompt = ChatPromptTemplate.from_messages(
    [("system", TRIAGE), ("human", "Goal:\n{goal}\n\nAnswer brief or detailed.")]
)
STYLES = ["brief", "detailed"]


class PlanState(TypedDict, total=False):
    goal: str
    style: str  # the triage router's literal (with ``triage``)
    plan: dict[str, Any]  # {"steps": [...]}, see plan_schema
    results: Annotated[list[str], operator.add]
    answer: str


@dataclass(frozen=True, slots=True)
class PlanExecuteJsonParams:
    """Sizes of a run (tokens are the model's; see text.approx_tokens)."""

    steps: int = 6  # the fan-out: executors per run
    goal_tokens: int = 256  # the input document's head, as the goal
    plan_tokens: int = 96  # raised to plan_budget: room for the longest plan
    step_chars: int = 24  # the longest step the plan may hold
    step_tokens: int = 64
    answer_tokens: int = 96
    # a supervisor first routes the goal to a brief or a detailed planner (a router
    # constrained to a choice: compiled, the routing runs on the server, a switch)
    triage: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def plan_schema(steps: int, step_chars: int) -> dict[str, Any]:
    """The plan's JSON Schema: exactly ``steps`` strings of at most ``step_chars``
    characters, so the fan-out's width is known and the reply always ends within
    :func:`plan_budget` (``ChatOpenAI`` refuses a structured reply that hit max_tokens) (pure)."""
    return list_schema("plan", "steps", steps, {"type": "string", "maxLength": step_chars})


def plan_budget(params: PlanExecuteJsonParams) -> int:
    """The planner's max_tokens: ``plan_tokens``, at least room for the longest plan the
    schema allows at up to 4 byte tokens a character (at one token a character, ``tiny``
    runs 8-step plans into the limit, which langchain-openai refuses). A model writing
    whitespace between the JSON tokens may still reach it; the server then closes the JSON
    within it (pure)."""
    return max(params.plan_tokens, 16 + params.steps * (4 * params.step_chars + 4))


def build_app(params: PlanExecuteJsonParams, models: ModelFactory) -> Any:
    """The StateGraph, compiled by LangGraph (pure): plan-execute's, with the constrained
    planner and the server-side fan-out."""
    fan_out = SendEach("execute", "plan", key="step", path=["steps"], keep=["goal"])
    schema = plan_schema(params.steps, params.step_chars)
    planner = plan_prompt | models.structured_chat(plan_budget(params), schema)
    triage = None
    if params.triage:
        choice = {"structured_outputs": {"choice": STYLES}}
        router = triage_prompt | models.chat(8).bind(extra_body=choice) | StrOutputParser()
        detailed = detailed_prompt | models.structured_chat(plan_budget(params), schema)
        triage = (router, detailed)
    return plan_graph(
        PlanState, planner, fan_out, models, params.step_tokens, params.answer_tokens, triage
    )


def plan(params: PlanExecuteJsonParams, text: str) -> int:
    """Planned model calls: the triage (with ``triage``), the plan, one per step, the
    answer."""
    return params.steps + 2 + int(params.triage)


def run(
    params: PlanExecuteJsonParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Plan, execute and answer for the head of ``text`` as the goal."""
    app = prepare_graph(models, build_app(params, models), "plan-execute-json")
    calls, depth = plan(params, text), 3 + int(params.triage)
    return run_plan_graph(app, params.goal_tokens, calls, text, config, depth)
