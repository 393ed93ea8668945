"""LangGraph's tutorial shapes written as its docs write them: Python function nodes that
call the model inside (``llm.invoke``, ``with_structured_output(...).invoke``), routers and
``Send`` fan-outs as functions. Each builder takes a ChatEclectus and returns the compiled
StateGraph, an input, and the client frames a compiled run should send (1, plus 1 per
Python decision on model output).

Prompts put a model's text after a newline and at the end of a message, where the tiny
model's BPE cuts the flat text at the same place as the segments (compiled and eager send
the same tokens while the server tokenizes segment by segment).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Send
from pydantic import BaseModel, Field

from eclectus.adapters.langchain import ChatEclectus

Built = tuple[Any, dict[str, Any], int]


# -- prompt chaining with a gate ----------------------------------------------------------


class ChainState(TypedDict, total=False):
    topic: str
    joke: str
    improved_joke: str
    final_joke: str


def prompt_chaining(llm: ChatEclectus) -> Built:
    """generate -> a gate on the joke's text (a decision: +1 frame) -> improve -> polish."""

    def generate_joke(state: ChainState) -> dict[str, str]:
        msg = llm.invoke(f"Write a short joke about {state['topic']}")
        return {"joke": msg.content}

    def check_punchline(state: ChainState) -> str:
        if "?" in state["joke"] or "!" in state["joke"]:
            return "Pass"
        return "Fail"

    def improve_joke(state: ChainState) -> dict[str, str]:
        msg = llm.invoke(f"Make this joke funnier by adding wordplay:\n{state['joke']}")
        return {"improved_joke": msg.content}

    def polish_joke(state: ChainState) -> dict[str, str]:
        msg = llm.invoke(f"Add a surprising twist to this joke:\n{state['improved_joke']}")
        return {"final_joke": msg.content}

    builder = StateGraph(ChainState)
    builder.add_node("generate_joke", generate_joke)
    builder.add_node("improve_joke", improve_joke)
    builder.add_node("polish_joke", polish_joke)
    builder.add_edge(START, "generate_joke")
    builder.add_conditional_edges(
        "generate_joke", check_punchline, {"Fail": "improve_joke", "Pass": END}
    )
    builder.add_edge("improve_joke", "polish_joke")
    builder.add_edge("polish_joke", END)
    return builder.compile(), {"topic": "cats"}, 2


# -- parallelization ----------------------------------------------------------------------


class ParallelState(TypedDict, total=False):
    topic: str
    joke: str
    story: str
    poem: str
    combined_output: str


def parallelization(llm: ChatEclectus) -> Built:
    """Three calls from START in parallel, an aggregator joining them in Python."""

    def call_llm_1(state: ParallelState) -> dict[str, str]:
        return {"joke": llm.invoke(f"Write a joke about {state['topic']}").content}

    def call_llm_2(state: ParallelState) -> dict[str, str]:
        return {"story": llm.invoke(f"Write a story about {state['topic']}").content}

    def call_llm_3(state: ParallelState) -> dict[str, str]:
        return {"poem": llm.invoke(f"Write a poem about {state['topic']}").content}

    def aggregator(state: ParallelState) -> dict[str, str]:
        combined = f"Here's a story, joke, and poem about {state['topic']}!\n\n"
        combined += f"STORY:\n{state['story']}\n\n"
        combined += f"JOKE:\n{state['joke']}\n\n"
        combined += f"POEM:\n{state['poem']}"
        return {"combined_output": combined}

    builder = StateGraph(ParallelState)
    for name, node in [("call_llm_1", call_llm_1), ("call_llm_2", call_llm_2)]:
        builder.add_node(name, node)
    builder.add_node("call_llm_3", call_llm_3)
    builder.add_node("aggregator", aggregator)
    for name in ("call_llm_1", "call_llm_2", "call_llm_3"):
        builder.add_edge(START, name)
        builder.add_edge(name, "aggregator")
    builder.add_edge("aggregator", END)
    return builder.compile(), {"topic": "cats"}, 1


# -- orchestrator-worker ------------------------------------------------------------------


class Section(BaseModel):
    name: str = Field(max_length=12)
    description: str = Field(max_length=16)


class Sections(BaseModel):
    sections: list[Section] = Field(min_length=1, max_length=2)


class OrchestratorState(TypedDict, total=False):
    topic: str
    sections: list[Section]
    completed_sections: Annotated[list[str], operator.add]
    final_report: str


class WorkerState(TypedDict):
    section: Section
    completed_sections: Annotated[list[str], operator.add]


def orchestrator_worker(llm: ChatEclectus) -> Built:
    """A structured plan, a Send per planned section (a decision on the model's list: +1
    frame), workers writing sections, a synthesizer joining them in Python."""
    planner = llm.model_copy(update={"max_tokens": 96}).with_structured_output(Sections)

    def orchestrator(state: OrchestratorState) -> dict[str, Any]:
        report_sections = planner.invoke(
            [
                SystemMessage(content="Generate a plan for the report."),
                HumanMessage(content=f"Here is the report topic: {state['topic']}"),
            ]
        )
        return {"sections": report_sections.sections}

    def llm_call(state: WorkerState) -> dict[str, list[str]]:
        section = llm.invoke(
            [
                SystemMessage(content="Write a report section."),
                HumanMessage(
                    content=f"Here is the section name: {state['section'].name} and "
                    f"description: {state['section'].description}"
                ),
            ]
        )
        return {"completed_sections": [section.content]}

    def synthesizer(state: OrchestratorState) -> dict[str, str]:
        completed_report_sections = "\n\n---\n\n".join(state["completed_sections"])
        return {"final_report": completed_report_sections}

    def assign_workers(state: OrchestratorState) -> list[Send]:
        return [Send("llm_call", {"section": s}) for s in state["sections"]]

    builder = StateGraph(OrchestratorState)
    builder.add_node("orchestrator", orchestrator)
    builder.add_node("llm_call", llm_call)
    builder.add_node("synthesizer", synthesizer)
    builder.add_edge(START, "orchestrator")
    builder.add_conditional_edges("orchestrator", assign_workers, ["llm_call"])
    builder.add_edge("llm_call", "synthesizer")
    builder.add_edge("synthesizer", END)
    return builder.compile(), {"topic": "tides"}, 2


# -- map-reduce with Send -----------------------------------------------------------------


class Subjects(BaseModel):
    subjects: list[str] = Field(min_length=3, max_length=3)


class Joke(BaseModel):
    joke: str = Field(max_length=40)


class BestJoke(BaseModel):
    id: int = Field(ge=0, le=2)


class OverallState(TypedDict, total=False):
    topic: str
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]
    best_selected_joke: str


class JokeState(TypedDict):
    subject: str


SUBJECTS_PROMPT = "Generate a list of 3 sub-topics that are all related to this topic: {topic}."
JOKE_PROMPT = "Generate a joke about {subject}"
BEST_JOKE_PROMPT = "Below are a bunch of jokes about {topic}. Select the best one.\n\n{jokes}"


def map_reduce(llm: ChatEclectus) -> Built:
    """LangGraph's map-reduce tutorial: structured subjects, a Send per subject (a decision
    on the model's list: +1 frame), structured jokes (``response.joke``: a field op), the
    best picked by a bounded index (``state["jokes"][response.id]``: an index op)."""
    model = llm.model_copy(update={"max_tokens": 64})

    def generate_topics(state: OverallState) -> dict[str, list[str]]:
        prompt = SUBJECTS_PROMPT.format(topic=state["topic"])
        response = model.with_structured_output(Subjects).invoke(prompt)
        return {"subjects": response.subjects}

    def generate_joke(state: JokeState) -> dict[str, list[str]]:
        prompt = JOKE_PROMPT.format(subject=state["subject"])
        response = model.with_structured_output(Joke).invoke(prompt)
        return {"jokes": [response.joke]}

    def continue_to_jokes(state: OverallState) -> list[Send]:
        return [Send("generate_joke", {"subject": s}) for s in state["subjects"]]

    def best_joke(state: OverallState) -> dict[str, str]:
        jokes = "\n\n".join(state["jokes"])
        prompt = BEST_JOKE_PROMPT.format(topic=state["topic"], jokes=jokes)
        response = model.with_structured_output(BestJoke).invoke(prompt)
        return {"best_selected_joke": state["jokes"][response.id]}

    builder = StateGraph(OverallState)
    builder.add_node("generate_topics", generate_topics)
    builder.add_node("generate_joke", generate_joke)
    builder.add_node("best_joke", best_joke)
    builder.add_edge(START, "generate_topics")
    builder.add_conditional_edges("generate_topics", continue_to_jokes, ["generate_joke"])
    builder.add_edge("generate_joke", "best_joke")
    builder.add_edge("best_joke", END)
    return builder.compile(), {"topic": "animals"}, 2


class Jokes(TypedDict, total=False):
    topic: str
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]
    best: str


def map_reduce_chains(llm: ChatEclectus, width: int = 3) -> Built:
    """The issue's map-reduce: Python nodes calling LCEL chains, a Send per subject the
    Python computed, the best picked from the jokes joined in Python: one frame."""
    joke_chain = PromptTemplate.from_template("A joke about {subject}:") | llm | StrOutputParser()
    best_chain = (
        PromptTemplate.from_template("Jokes:\n{jokes}\nThe best one:") | llm | StrOutputParser()
    )

    def subjects(state: Jokes) -> dict[str, list[str]]:
        return {"subjects": [f"{state['topic']} #{i}" for i in range(width)]}

    def fan_out(state: Jokes) -> list[Send]:
        return [Send("joke", {"subject": s}) for s in state["subjects"]]

    def joke(state: JokeState) -> dict[str, list[str]]:
        return {"jokes": [joke_chain.invoke({"subject": state["subject"]})]}

    def best(state: Jokes) -> dict[str, str]:
        return {"best": best_chain.invoke({"jokes": "\n".join(state["jokes"])})}

    builder = StateGraph(Jokes)
    builder.add_node("subjects", subjects)
    builder.add_node("joke", joke)
    builder.add_node("best", best)
    builder.add_edge(START, "subjects")
    builder.add_conditional_edges("subjects", fan_out, ["joke"])
    builder.add_edge("joke", "best")
    builder.add_edge("best", END)
    return builder.compile(), {"topic": "owls"}, 1


# -- supervisor with Command --------------------------------------------------------------


class Router(TypedDict):
    """Worker to route to next. If no workers needed, route to FINISH."""

    next: Literal["researcher", "coder", "FINISH"]


class SupervisorState(MessagesState):
    next: str


SUPERVISOR_PROMPT = (
    "You are a supervisor managing these workers: researcher, coder. Given the request, "
    "respond with the worker to act next. When finished, respond with FINISH."
)


def supervisor(llm: ChatEclectus, max_messages: int = 3) -> Built:
    """The multi-agent supervisor: a structured router returning ``Command(goto=...)`` (a
    decision on model output per turn), workers answering with a named message."""
    router = llm.model_copy(update={"max_tokens": 24}).with_structured_output(Router)

    def supervisor_node(
        state: SupervisorState,
    ) -> Command[Literal["researcher", "coder", "__end__"]]:
        messages = [{"role": "system", "content": SUPERVISOR_PROMPT}] + state["messages"]
        response = router.invoke(messages)
        goto = response["next"]
        if goto == "FINISH" or len(state["messages"]) >= max_messages:
            goto = END
        return Command(goto=goto, update={"next": goto})

    def research_node(state: SupervisorState) -> Command[Literal["supervisor"]]:
        result = llm.invoke(state["messages"])
        update = {"messages": [HumanMessage(content=result.content, name="researcher")]}
        return Command(update=update, goto="supervisor")

    def code_node(state: SupervisorState) -> Command[Literal["supervisor"]]:
        result = llm.invoke(state["messages"])
        update = {"messages": [HumanMessage(content=result.content, name="coder")]}
        return Command(update=update, goto="supervisor")

    builder = StateGraph(SupervisorState)
    builder.add_edge(START, "supervisor")
    builder.add_node("supervisor", supervisor_node)
    builder.add_node("researcher", research_node)
    builder.add_node("coder", code_node)
    return builder.compile(), {"messages": [("user", "Find the mean of 3 and 5.")]}, -1


# -- a chatbot node ----------------------------------------------------------------------


def chatbot(llm: ChatEclectus) -> Built:
    """``def chatbot(state): return {"messages": [llm.invoke(state["messages"])]}``."""

    def chatbot_node(state: MessagesState) -> dict[str, list[Any]]:
        return {"messages": [llm.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chatbot", chatbot_node)
    builder.add_edge(START, "chatbot")
    builder.add_edge("chatbot", END)
    return builder.compile(), {"messages": [("user", "Hello there!")]}, 1


TUTORIALS = {
    "prompt_chaining": prompt_chaining,
    "parallelization": parallelization,
    "orchestrator_worker": orchestrator_worker,
    "map_reduce": map_reduce,
    "map_reduce_chains": map_reduce_chains,
    "supervisor": supervisor,
    "chatbot": chatbot,
}
