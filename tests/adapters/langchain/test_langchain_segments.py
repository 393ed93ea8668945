"""Exactness beyond the tiny model: the eager chain (drop-in model + tracing hook) and the
compiled chain hand the server the very same prompts, cut at the same seams (the pins'
points), so any tokenizer sees identical token ids and greedy outputs agree.

The runner's prompt builder is wrapped to record each request's resolved segments (the
real engine still runs every request)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator
from typing import Any

import pytest
from engine_probe import engine_prompts
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.runnables import Runnable

from eclectus.adapters.langchain import ChatEclectus, EclectusLLM, compile, tracing
from eclectus.server.front.app import EclectusServer

Segments = tuple[str, ...]


@pytest.fixture
def engine_segments(eclectus_server: EclectusServer) -> Iterator[list[Segments]]:
    """Every engine request's segments (empty ones dropped: they add no tokens)."""
    with engine_prompts(eclectus_server, drop_empty=True) as seen:
        yield seen


def run_both(chain: Runnable, value: Any, seen: list[Segments]) -> None:
    """Eager then compiled; the two runs' engine segments must be the same multiset."""
    seen.clear()
    chain.invoke(value)
    eager = sorted(seen)
    seen.clear()
    compile(chain).invoke(value)
    assert sorted(seen) == eager
    assert eager, "no engine request was recorded"


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})


def test_chat_prompt_with_history(chat: ChatEclectus, engine_segments: list[Segments]) -> None:
    """Role headers, template text, values and placeholder messages cut alike."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be {tone}."), MessagesPlaceholder("history"), ("human", "Q: {q}")]
    )
    history = [HumanMessage("earlier"), AIMessage("reply")]
    value = {"tone": "brief", "history": history, "q": "why?"}
    run_both(prompt | chat | StrOutputParser(), value, engine_segments)
    assert any("brief" in segment for segment in engine_segments[0])


def test_generated_text_fed_straight_to_a_model(
    chat: ChatEclectus, engine_segments: list[Segments]
) -> None:
    """A model's output given to the next model as its whole message is its own segment in
    both runs (eager: the tracing hook's default; compiled: a variable)."""
    first = PromptTemplate.from_template("Write about {topic}") | chat | StrOutputParser()
    run_both(first | chat | StrOutputParser(), {"topic": "rain"}, engine_segments)


def test_map_reduce_list_rendering(chat: ChatEclectus, engine_segments: list[Segments]) -> None:
    """str(list) of map outputs: one segment, eagerly and via the server's repr_list op."""
    summarize = PromptTemplate.from_template("Sum up: {doc}") | chat | StrOutputParser()
    reduce_prompt = PromptTemplate.from_template("All: {summaries}\nDone:")
    chain = {"summaries": summarize.map()} | reduce_prompt | chat | StrOutputParser()
    run_both(chain, [{"doc": "a"}, {"doc": "b"}, {"doc": "c"}], engine_segments)


def test_completion_model_on_a_chat_prompt(
    eclectus_server: EclectusServer, engine_segments: list[Segments]
) -> None:
    """A chat prompt into EclectusLLM: Role: lines with the same value boundaries."""
    llm = EclectusLLM(max_tokens=4, temperature=0, model_kwargs={"ignore_eos": True})
    prompt = ChatPromptTemplate.from_messages([("system", "Be {x}."), ("human", "{q}")])
    run_both(prompt | llm, {"x": "kind", "q": "hello"}, engine_segments)


def test_disable_in_context_turns_the_hook_off(
    eclectus_server: EclectusServer, engine_segments: list[Segments]
) -> None:
    """With the hook on, a template's constant text and value are separate segments; after
    ``disable_in_context`` (in a copied context) a prompt goes as one text."""
    llm = EclectusLLM(max_tokens=2, temperature=0, model_kwargs={"ignore_eos": True})
    chain = PromptTemplate.from_template("Say {x} now") | llm
    chain.invoke({"x": "hi"})
    assert engine_segments == [("Say ", "hi", " now")]
    engine_segments.clear()

    def without_hook() -> None:
        tracing.disable_in_context()
        chain.invoke({"x": "yo"})

    contextvars.copy_context().run(without_hook)
    assert engine_segments == [("Say yo now",)]
    engine_segments.clear()
    chain.invoke({"x": "hey"})  # the caller's context keeps the hook
    assert engine_segments == [("Say ", "hey", " now")]


def test_one_apps_template_does_not_leak_into_another_app(
    chat: ChatEclectus, engine_segments: list[Segments]
) -> None:
    """An app whose template has the constant text "Be brief." runs; then another app sends
    "Be brief." as its own system message. The second prompt is cut exactly as if the
    first had never run: the message is a value segment, not glued to template text."""
    messages = [SystemMessage("Be brief."), HumanMessage("What is rain?")]
    chat.invoke(messages)
    (alone,) = engine_segments
    assert "Be brief." in alone and "What is rain?" in alone
    engine_segments.clear()

    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")])
    (prompt | chat).invoke({"q": "What is rain?"})
    (templated,) = engine_segments
    assert "Be brief." not in templated  # inside its run: template text, joined to the header
    engine_segments.clear()

    chat.invoke(messages)
    assert engine_segments == [alone]


def test_completion_batch_keeps_every_inputs_template(
    eclectus_server: EclectusServer, engine_segments: list[Segments]
) -> None:
    """A chain's .batch() runs each input in its own run tree, and LangChain hands the
    completion model all prompts with only the first run: every prompt still keeps its own
    template's boundaries."""
    llm = EclectusLLM(max_tokens=2, temperature=0, model_kwargs={"ignore_eos": True})
    chain = PromptTemplate.from_template("Say {x} now") | llm
    chain.batch([{"x": "hi"}, {"x": "yo"}, {"x": "hey"}])
    assert sorted(engine_segments) == [("Say ", x, " now") for x in ("hey", "hi", "yo")]
    engine_segments.clear()
    asyncio.run(chain.abatch([{"x": "hi"}, {"x": "yo"}]))
    assert sorted(engine_segments) == [("Say ", x, " now") for x in ("hi", "yo")]
