"""Every adapter path that renders a chat template sends a chat prompt (no BOS added beyond
the template's), so on one server the same messages get the same greedy text on all of
them, and that text is the stock stack's: ChatEclectus over the WebSocket (eager and
compiled), a LangGraph app compiled to a graph, LlamaIndex's chat, the stock ``openai``
client on ``/v1/chat/completions``, and transformers' ``apply_chat_template`` + greedy
``generate`` (tests/stock_reference.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, TypedDict

import openai
import pytest
import stock_reference as stock
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import END, START, StateGraph
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langchain import compile as compile_chain
from eclectus.adapters.langgraph import EagerFallbackWarning
from eclectus.adapters.langgraph import compile as compile_graph
from eclectus.adapters.llamaindex import Eclectus
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
CHATS = [
    ("You answer in one short line.", "Q: say hello"),
    ("Be brief.", "What is rain?"),
    ("You are a helpful assistant.", "Name a color"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[EclectusServer]:
    with serve_in_thread(ServerConfig(port=0, model="tiny")) as running:
        yield running


@pytest.fixture(scope="module")
def chat_model(server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(base_url=server.url, temperature=0, max_tokens=MAX_TOKENS)


def expected(system: str, user: str) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return stock.chat(messages, MAX_TOKENS)


@pytest.mark.parametrize(("system", "user"), CHATS)
def test_chateclectus_and_the_openai_client_answer_alike(
    server: EclectusServer, chat_model: ChatEclectus, system: str, user: str
) -> None:
    """ChatEclectus over the WebSocket and the stock openai client on /v1 of the same
    server: the same text, transformers' text."""
    ours = chat_model.invoke([SystemMessage(system), HumanMessage(user)]).content
    client = openai.OpenAI(base_url=server.openai_url, api_key="unused")
    theirs = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert ours == theirs.choices[0].message.content == expected(system, user)


def test_a_compiled_chain_answers_as_the_eager_one(chat_model: ChatEclectus) -> None:
    """The chain compiled to a graph renders the template on the client as the eager call
    does, and marks the call a chat prompt too."""
    prompt = ChatPromptTemplate.from_messages([("system", "{system}"), ("human", "{user}")])
    chain = prompt | chat_model | StrOutputParser()
    inputs = [{"system": s, "user": u} for s, u in CHATS]
    assert compile_chain(chain).batch(inputs) == [expected(s, u) for s, u in CHATS]


class QA(TypedDict, total=False):
    system: str
    user: str
    answer: str


def test_a_compiled_langgraph_node_answers_as_transformers(chat_model: ChatEclectus) -> None:
    prompt = ChatPromptTemplate.from_messages([("system", "{system}"), ("human", "{user}")])
    builder = StateGraph(QA)
    builder.add_node("answer", {"answer": prompt | chat_model | StrOutputParser()})
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    app: Any = compile_graph(builder.compile())
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)  # on the server, as one graph
        for system, user in CHATS:
            state = app.invoke({"system": system, "user": user})
            assert state["answer"] == expected(system, user)
            assert app.last_graph is not None and app.last_graph.num_calls == 1


def test_llamaindex_chat_answers_as_transformers(server: EclectusServer) -> None:
    llm = Eclectus(url=server.url, temperature=0, max_tokens=MAX_TOKENS)
    try:
        for system, user in CHATS:
            messages = [
                ChatMessage(role=MessageRole.SYSTEM, content=system),
                ChatMessage(role=MessageRole.USER, content=user),
            ]
            assert llm.chat(messages).message.content == expected(system, user)
    finally:
        llm.close()
