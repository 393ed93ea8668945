"""``multi-agent-json``: the multi-agent team (multi_agent.py) with its file list as JSON,
fanned out on the server.

The architect writes the design, then the file list constrained to JSON
(``with_structured_output``: ``{"files": [exactly N names]}``); a router (``SendEach``)
sends one engineer per name; each engineer is one LCEL chain that drafts its file, then,
per round, gets a review and revises (multi_agent.py's prompts). Compiled, the whole app is
one server graph: the fan-out is a server-side map whose per-file work is the engineer's
pipeline of calls (docs/protocol.md, MapSpec ``then``), so a run costs one client frame
whatever the team's size (``details['client frames']``). ``multi-agent-graph`` is the same
team with a text list read by a Python router: two client frames.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableConfig, RunnablePick

from eclectus.adapters.langgraph.fanout import SendEach
from eclectus.recipes.graphs import frame_details, list_schema, prepare_graph
from eclectus.recipes.multi_agent import (
    ARCHITECT,
    MultiAgentParams,
    engineer_chain,
    plan,
    requirements_of,
)
from eclectus.recipes.multi_agent_graph import team_graph
from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory

NAME_CHARS = 16  # the longest file name the list's schema allows
# a file name: ASCII path characters, so a name is at most NAME_CHARS tokens
NAME_PATTERN = f"^[A-Za-z0-9_./-]{{1,{NAME_CHARS}}}$"

list_prompt = ChatPromptTemplate.from_messages(
    [
        ("system", ARCHITECT),
        ("human", "Requirements:\n{requirements}\n\nWrite the design."),
        ("ai", "{design}"),
        ("human", 'List the source files to write. Reply with JSON: {{"files": [...]}}.'),
    ]
)


class TeamState(TypedDict, total=False):
    requirements: str
    design: str
    file_list: dict[str, Any]  # {"files": [...]}, see files_schema
    files: Annotated[list[str], operator.add]  # each file's final code, in list order


def files_schema(files: int) -> dict[str, Any]:
    """The list's JSON Schema: exactly ``files`` names of 1 to NAME_CHARS path characters,
    so the team's size is known and the compact reply ends within :func:`list_budget`
    (pure)."""
    return list_schema("files", "files", files, {"type": "string", "pattern": NAME_PATTERN})


def list_budget(params: MultiAgentParams) -> int:
    """The list call's max_tokens: ``list_tokens``, at least room for the longest compact
    list the schema allows, a token a character (langchain-openai refuses a structured reply
    that hit max_tokens) (pure)."""
    return max(params.list_tokens, 16 + params.files * (NAME_CHARS + 4))


def build_app(params: MultiAgentParams, models: ModelFactory) -> Any:
    """The StateGraph, compiled by LangGraph (pure): multi-agent-graph's, with the
    constrained list and the fan-out the compiler maps on the server. Each engineer writes
    ``[code]``, the file after every round."""
    listing = list_prompt | models.structured_chat(list_budget(params), files_schema(params.files))
    route = SendEach("engineer", "file_list", key="filename", path=["files"], keep=["design"])
    engineer = engineer_chain(params, models) | RunnablePick("code") | (lambda code: [code])
    return team_graph(TeamState, params, models, listing, route, {"files": engineer})


def run(
    params: MultiAgentParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Run the team on ``text`` as requirements; the output is every file, by name."""
    app = prepare_graph(models, build_app(params, models), "multi-agent-json")
    config = {**config, "max_concurrency": params.width}
    state = app.invoke({"requirements": requirements_of(params, text)}, config)
    names = state["file_list"]["files"]
    output = "\n\n".join(f"## {n}\n{code}" for n, code in zip(names, state["files"], strict=True))
    depth = 2 + 1 + 2 * params.rounds
    details = {"files": ", ".join(names), **frame_details(app, plan(params, text))}
    return RecipeOutput(output, depth, plan(params, text), details)
