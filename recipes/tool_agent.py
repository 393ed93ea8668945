"""``tool-agent``: a LangGraph tool-using agent (ReAct: model -> tools -> model ...) as an
ordinary StateGraph over ``MessagesState`` with LangGraph's own ``ToolNode``.

The agent answers a question about the input document with two tools over it: ``lookup``
(the document's sentences that mention a term) and ``count_words``. For a run of a known
size, the first ``tool_rounds`` turns force a tool call (``bind_tools(tool_choice=...,
strict=True)``, the arguments constrained to the tool's schema, so they parse by
construction, on stock vLLM too); the last turn answers without tools. So a run makes
``tool_rounds + 1`` model calls, in sequence, when every forced call closes within
``tool_tokens``. A call the model runs to its budget unclosed (``tiny`` writes whitespace
runs inside the arguments, which JSON allows and stock vLLM's grammar too) parses as no call:
by default the loop asks again, as a ReAct agent does, so the run's length depends on its
input (7-23 model calls over 16 inputs on ``tiny``); with ``retry_failed_calls=False`` the
failed turn counts as its round and every run makes exactly ``tool_rounds + 1`` calls.

Compiled, every tool turn is a client cut: a tool runs on the client (it is Python), the
model's reply must be parsed into tool calls there, and ``add_messages`` needs the
messages, so the frames per run grow with the rounds (``details['client frames']``); the
final answer (an LCEL node) lowers onto the server. The recipe is the honest baseline of
what compiling a tool loop gives today (docs/langgraph.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from eclectus.recipes.graphs import frame_details, prepare_graph
from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory
from eclectus.recipes.text import split_chunks

SYSTEM = (
    "You answer questions about a document. Use the tools to look facts up in it, then "
    "answer in a few sentences."
)
prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), MessagesPlaceholder("messages")])
SENTENCE = re.compile(r"(?<=[.!?])\s+")
TOOL_NAMES = ("lookup", "count_words")


@dataclass(frozen=True, slots=True)
class ToolAgentParams:
    """Sizes of a run (tokens are the model's; see text.approx_tokens)."""

    tool_rounds: int = 3  # turns that must call a tool before the answer
    question_tokens: int = 48  # the document's head, quoted in the question
    tool_tokens: int = 48  # a tool call (its shortest takes ~30 tokens on tiny)
    answer_tokens: int = 96
    max_hits: int = 3  # sentences a lookup returns
    retry_failed_calls: bool = True  # a forced turn that parsed as no call is asked again

    def __post_init__(self) -> None:
        if self.tool_rounds < 0:
            raise ValueError(f"tool_rounds must be >= 0, got {self.tool_rounds}")


def make_tools(text: str, max_hits: int) -> list[BaseTool]:
    """The agent's tools over ``text`` (pure)."""
    sentences = [s.strip() for s in SENTENCE.split(text) if s.strip()]

    @tool
    def lookup(term: str) -> str:
        """Sentences of the document that mention ``term`` (case-insensitive)."""
        needle = term.strip().lower()
        hits = [s for s in sentences if needle and needle in s.lower()][:max_hits]
        return "\n".join(hits) if hits else f"No sentence mentions {term!r}."

    @tool
    def count_words(text: str) -> int:
        """The number of words in ``text``."""
        return len(text.split())

    return [lookup, count_words]


def rounds_done(state: MessagesState, retry_failed_calls: bool = True) -> int:
    """Tool rounds so far (pure): the AI turns that made a call, or, without retries, every
    AI turn (before the answer, each one is a forced tool turn)."""
    turns = [m for m in state["messages"] if isinstance(m, AIMessage)]
    return sum(1 for m in turns if m.tool_calls) if retry_failed_calls else len(turns)


def build_app(params: ToolAgentParams, models: ModelFactory, text: str) -> Any:
    """The StateGraph, compiled by LangGraph (pure)."""
    tools = make_tools(text, params.max_hits)
    chat = models.chat(params.tool_tokens)
    # one forced tool per round, alternating, so a run exercises both tools. strict: stock
    # vLLM (0.32, --tool-strict-level auto) pins a tool's arguments to its schema only for a
    # strict tool; for others it constrains the call's envelope and leaves the arguments any
    # JSON, and tiny then writes a string there, which langchain-openai refuses
    forced = [
        prompt | chat.bind_tools(tools, tool_choice=name, parallel_tool_calls=False, strict=True)
        for name in TOOL_NAMES
    ]
    answer = prompt | models.chat(params.answer_tokens) | (lambda m: {"messages": [m]})

    def act(state: MessagesState, config: RunnableConfig) -> dict[str, list[Any]]:
        turn = rounds_done(state, params.retry_failed_calls)
        return {"messages": [forced[turn % len(forced)].invoke(state, config)]}

    def route(state: MessagesState) -> str:
        done = rounds_done(state, params.retry_failed_calls)
        return "agent" if done < params.tool_rounds else "answer"

    builder = StateGraph(MessagesState)
    builder.add_node("agent", act)  # a forced tool call (Python: it picks the tool)
    builder.add_node("tools", ToolNode(tools))
    builder.add_node("answer", answer)  # an LCEL node: lowers onto the server
    builder.add_conditional_edges(START, route, ["agent", "answer"])
    builder.add_edge("agent", "tools")
    builder.add_conditional_edges("tools", route, ["agent", "answer"])
    builder.add_edge("answer", END)
    return builder.compile()


def plan(params: ToolAgentParams, text: str) -> int:
    """Planned model calls: one per tool round, then the answer."""
    return params.tool_rounds + 1


def run(
    params: ToolAgentParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Answer a question about ``text`` with the tools."""
    app = prepare_graph(models, build_app(params, models, text), "tool-agent")
    head = split_chunks(text, params.question_tokens, 1)[0]
    question = f"What are the key facts of the document that begins: {head!r}?"
    state = app.invoke({"messages": [("human", question)]}, config)
    tool_results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    # each model call appends its reply: more than the plan when a forced call ran to its
    # budget without closing (no tool call parsed), and the loop asked again
    turns = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
    details: dict[str, Any] = {
        "tool calls": len(tool_results),
        "tools used": ", ".join(dict.fromkeys(m.name or "?" for m in tool_results)) or "none",
        "model turns": turns,
        **frame_details(app, turns),
    }
    server_calls = getattr(getattr(app, "last_graph", None), "num_calls", None)
    if server_calls is not None:  # compiled: the calls cuts made, each a round trip
        details["calls run on the client"] = turns - server_calls
    answer = state["messages"][-1]
    depth = params.tool_rounds + 1
    return RecipeOutput(str(answer.content), depth, plan(params, text), details)
