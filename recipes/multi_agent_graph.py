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
from langchain_core.runnables import Runnable, RunnableConfig, RunnablePassthrough, RunnablePick
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from eclectus.recipes.graphs import frame_details, prepare_graph
from eclectus.recipes.multi_agent import (
    MultiAgentParams,
    architect_prompt,
    file_names,
    list_prompt,
    plan,
    requirements_of,
    review_prompt,
    revise_prompt,
    write_prompt,
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
    parser = StrOutputParser()
    coder, reviewer = models.chat(params.code_tokens), models.chat(params.review_tokens)
    engineer: Runnable = RunnablePassthrough.assign(code=write_prompt | coder | parser)
    for _ in range(params.rounds):
        engineer = engineer | RunnablePassthrough.assign(review=review_prompt | reviewer | parser)
        engineer = engineer | RunnablePassthrough.assign(code=revise_prompt | coder | parser)
    return engineer | RunnablePick(["filename", "code"]) | (lambda f: {"files": [f]})


def build_app(params: MultiAgentParams, models: ModelFactory) -> Any:
    """The StateGraph, compiled by LangGraph (pure)."""
    parser = StrOutputParser()

    def assign_files(state: TeamState) -> list[Send]:
        names = file_names(state["file_list"], params.files)
        return [Send("engineer", {"design": state["design"], "filename": n}) for n in names]

    builder = StateGraph(TeamState)
    design = architect_prompt | models.chat(params.design_tokens) | parser
    builder.add_node("architect", {"design": design})
    listing = list_prompt | models.chat(params.list_tokens) | parser
    builder.add_node("file_list", {"file_list": listing})
    builder.add_node("engineer", build_engineer(params, models))
    builder.add_edge(START, "architect")
    builder.add_edge("architect", "file_list")
    builder.add_conditional_edges("file_list", assign_files, ["engineer"])
    builder.add_edge("engineer", END)
    return builder.compile()


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
