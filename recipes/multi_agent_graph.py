"""``multi-agent-graph``: the multi-agent team (multi_agent.py) as a LangGraph StateGraph.

The architect writes the design and then the file list (two LCEL nodes); a router sends one
engineer per file (``Send``); each engineer is one LCEL chain that drafts its file, then, per
round, gets a review and revises. Compiled, the architect and the whole team run as server
graphs, cut once at the router (it reads the file list): two client frames per run
whatever the team size. The prompts are multi_agent.py's, so both recipes make the same
calls.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnableConfig, RunnablePick
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from eclectus.recipes.graphs import frame_details, prepare_graph
from eclectus.recipes.multi_agent import (
    MultiAgentParams,
    architect_prompt,
    engineer_chain,
    file_names,
    list_prompt,
    plan,
    requirements_of,
)
from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory


class TeamState(TypedDict, total=False):
    requirements: str
    design: str
    file_list: str
    files: Annotated[list[dict[str, str]], operator.add]


def build_engineer(params: MultiAgentParams, models: ModelFactory) -> Runnable:
    """Input ``{design, filename}``; output ``{"files": [{filename, code}]}`` (pure)."""
    tail = RunnablePick(["filename", "code"]) | (lambda f: {"files": [f]})
    return engineer_chain(params, models) | tail


def team_graph(
    state: type,
    params: MultiAgentParams,
    models: ModelFactory,
    listing: Runnable,
    route: Any,
    engineer: Runnable | dict[str, Runnable],
) -> Any:
    """architect (writes ``design``) -> file_list (``listing`` writes ``file_list``) ->
    ``route`` (a conditional edge sending each file to "engineer") -> ``engineer``, compiled
    by LangGraph; shared with multi-agent-json (pure)."""
    design = architect_prompt | models.chat(params.design_tokens) | StrOutputParser()
    builder = StateGraph(state)
    builder.add_node("architect", {"design": design})
    builder.add_node("file_list", {"file_list": listing})
    builder.add_node("engineer", engineer)
    builder.add_edge(START, "architect")
    builder.add_edge("architect", "file_list")
    builder.add_conditional_edges("file_list", route, ["engineer"])
    builder.add_edge("engineer", END)
    return builder.compile()


def build_app(params: MultiAgentParams, models: ModelFactory) -> Any:
    """The StateGraph, compiled by LangGraph (pure)."""

    def assign_files(state: TeamState) -> list[Send]:
        names = file_names(state["file_list"], params.files)
        return [Send("engineer", {"design": state["design"], "filename": n}) for n in names]

    listing = list_prompt | models.chat(params.list_tokens) | StrOutputParser()
    engineer = build_engineer(params, models)
    return team_graph(TeamState, params, models, listing, assign_files, engineer)


def run(
    params: MultiAgentParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Run the team on ``text`` as requirements; the output is every file, by name."""
    app = prepare_graph(models, build_app(params, models), "multi-agent-graph")
    config = {**config, "max_concurrency": params.width}
    state = app.invoke({"requirements": requirements_of(params, text)}, config)
    output = "\n\n".join(f"## {f['filename']}\n{f['code']}" for f in state["files"])
    depth = 2 + 1 + 2 * params.rounds
    names = ", ".join(f["filename"] for f in state["files"])
    details = {"files": names, **frame_details(app, plan(params, text))}
    return RecipeOutput(output, depth, plan(params, text), details)
