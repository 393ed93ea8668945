"""The drop-in models against the real local server: batches as one frame, usage, tokens,
the completion model, and the tracing hook's segments and application tag."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from lc_helpers import metric

from eclectus.adapters.connection import connection_for, open_connections
from eclectus.adapters.langchain import ChatEclectus, EclectusLLM
from eclectus.adapters.langchain.pieces import Piece, Value
from eclectus.adapters.langchain.tracing import TRACER, config_run_id
from eclectus.server.front.app import EclectusServer

FRAMES = "eclectus_client_frames_total"

PiecesOf = Callable[[PromptValue, UUID | None], list[Piece]]


def seen_in_run(prompt: Runnable, inputs: dict[str, Any], pieces_of: PiecesOf) -> list[Piece]:
    """The pieces a model placed after ``prompt`` in one chain would send: looked up inside
    the chain's run (the tracer forgets a run's templates when the run ends)."""

    def look(value: PromptValue, config: RunnableConfig) -> list[Piece]:
        return pieces_of(value, config_run_id(config))

    return (prompt | RunnableLambda(look)).invoke(inputs)


def chat_pieces(chat: ChatEclectus) -> PiecesOf:
    return lambda value, run_id: chat.prompt_pieces(value.to_messages(), run_id=run_id)


def llm_pieces(value: PromptValue, run_id: UUID | None) -> list[Piece]:
    return EclectusLLM.prompt_pieces(value.to_string(), run_id)


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=6, temperature=0, model_kwargs={"ignore_eos": True})


@pytest.fixture
def llm(eclectus_server: EclectusServer) -> EclectusLLM:
    return EclectusLLM(max_tokens=6, temperature=0, model_kwargs={"ignore_eos": True})


def test_chat_batch_is_one_frame_and_matches_invoke(
    eclectus_server: EclectusServer, chat: ChatEclectus
) -> None:
    """A batch of four prompts reaches the server in one frame; answers equal invoke's."""
    prompts = ["one", "two", "three", "four"]
    singles = [chat.invoke(p).content for p in prompts]  # also opens the session
    before = metric(eclectus_server, FRAMES)
    batch = chat.batch(prompts)
    assert metric(eclectus_server, FRAMES) - before == 1
    assert [m.content for m in batch] == singles


async def test_chat_abatch_is_one_frame(
    eclectus_server: EclectusServer, chat: ChatEclectus
) -> None:
    """The async batch also ships its prompts in one frame."""
    await chat.ainvoke("warm")
    before = metric(eclectus_server, FRAMES)
    results = await chat.abatch(["a", "b", "c"])
    assert metric(eclectus_server, FRAMES) - before == 1
    assert all(r.usage_metadata and r.usage_metadata["output_tokens"] == 6 for r in results)


async def test_chat_sync_entry_points_work_inside_a_running_loop(
    eclectus_server: EclectusServer, chat: ChatEclectus
) -> None:
    """As in a Jupyter cell, where an event loop runs in the calling thread: invoke,
    stream and batch block on the connection's own loop, and answer what ainvoke does
    (the batch still in one frame)."""
    asyncio.get_running_loop()  # the test runs on one
    expected = (await chat.ainvoke("cell")).content
    assert chat.invoke("cell").content == expected
    assert "".join(str(chunk.content) for chunk in chat.stream("cell")) == expected
    before = metric(eclectus_server, FRAMES)
    assert [m.content for m in chat.batch(["cell", "cell"])] == [expected, expected]
    assert metric(eclectus_server, FRAMES) - before == 1


def test_chat_usage_and_metadata(chat: ChatEclectus) -> None:
    """Usage counts the rendered chat prompt's tokens: the server's count of its text, no
    BOS added (a chat prompt takes the template's special tokens only, as vLLM's chat
    endpoint)."""
    message = chat.invoke([HumanMessage("hi")])
    assert message.usage_metadata is not None
    prompt_tokens = chat.get_num_tokens("<|user|>\nhi\n<|assistant|>\n")
    assert message.usage_metadata["input_tokens"] == prompt_tokens
    assert message.usage_metadata["output_tokens"] == 6
    assert message.response_metadata["model_name"] == "tiny"
    assert message.response_metadata["finish_reason"] == "length"


def test_get_num_tokens_uses_the_server_tokenizer(
    eclectus_server: EclectusServer, chat: ChatEclectus, llm: EclectusLLM
) -> None:
    """Token counts come from the server's tokenizer (tiny's BPE), not a local guess."""
    engine_tokenizer = eclectus_server.ctx.front.tokenizer
    assert chat.get_num_tokens("héllo") == llm.get_num_tokens("héllo")
    assert chat.get_num_tokens("héllo") == len(
        engine_tokenizer.encode("héllo", add_special_tokens=False)
    )
    assert chat.get_num_tokens_from_messages([HumanMessage("hi")]) == chat.get_num_tokens(
        "<|user|>\nhi\n<|assistant|>\n"
    )


def test_llm_generate_is_one_frame_and_streams(
    eclectus_server: EclectusServer, llm: EclectusLLM
) -> None:
    """A completion batch is one frame; streaming concatenates to invoke's text."""
    singles = [llm.invoke(p) for p in ["x", "y", "z"]]
    before = metric(eclectus_server, FRAMES)
    result = llm.generate(["x", "y", "z"])
    assert metric(eclectus_server, FRAMES) - before == 1
    assert [g[0].text for g in result.generations] == singles
    assert result.llm_output and result.llm_output["token_usage"]["completion_tokens"] == 18
    assert "".join(llm.stream("x")) == singles[0]


async def test_llm_async_paths(llm: EclectusLLM) -> None:
    """ainvoke, abatch and astream agree with invoke."""
    expected = llm.invoke("q")
    assert await llm.ainvoke("q") == expected
    assert await llm.abatch(["q", "q"]) == [expected, expected]
    assert "".join([c async for c in llm.astream("q")]) == expected


def test_tracing_hook_sends_template_boundaries(chat: ChatEclectus) -> None:
    """Inside a chain, the model's prompt keeps the template's variable values as their own
    segments, and its session carries the chain's name as the application."""
    prompt = ChatPromptTemplate.from_messages([("system", "Be {tone}."), ("human", "Q: {q}")])
    chain = (prompt | chat | StrOutputParser()).with_config(run_name="qa-app")
    answer = chain.invoke({"tone": "brief", "q": "why?"})
    assert chain.invoke({"tone": "brief", "q": "why?"}) == answer  # a run sees only its own
    pieces = seen_in_run(prompt, {"tone": "brief", "q": "why?"}, chat_pieces(chat))
    assert Value("why?") in pieces and Value("brief") in pieces
    assert TRACER.pieces_for("Q: why?", None) is None  # outside the run, nothing is known
    assert any(c.app == "qa-app" and c.url == chat.eclectus_url for c in open_connections())


def test_llm_in_chain_uses_string_template_pieces(llm: EclectusLLM) -> None:
    """A completion model after a PromptTemplate sends the template's pieces."""
    prompt = PromptTemplate.from_template("Title: {title}\nStory:")
    text = (prompt | llm).invoke({"title": "Rain"})
    assert (prompt | llm).invoke({"title": "Rain"}) == text
    pieces = seen_in_run(prompt, {"title": "Rain"}, llm_pieces)
    assert pieces == ["Title: ", Value("Rain"), "\nStory:"]


@pytest.mark.parametrize(
    ("template", "fmt"), [("Hi {{ name }}!", "jinja2"), ("Hi {{{name}}}!", "mustache")]
)
def test_tracing_hook_handles_every_template_format(
    llm: EclectusLLM, template: str, fmt: str
) -> None:
    """jinja2 and mustache prompts also reach the model with their boundaries."""
    prompt = PromptTemplate.from_template(template, template_format=fmt)
    assert (prompt | llm).invoke({"name": fmt})
    assert seen_in_run(prompt, {"name": fmt}, llm_pieces) == ["Hi ", Value(fmt), "!"]


def test_a_chains_batches_share_its_application_session(chat: ChatEclectus) -> None:
    """The map's batch and the reduce call of one named chain use one session, tagged with
    the chain's name."""
    summarize = PromptTemplate.from_template("Sum up: {doc}") | chat | StrOutputParser()
    reduce_prompt = PromptTemplate.from_template("All: {summaries}")
    chain = ({"summaries": summarize.map()} | reduce_prompt | chat).with_config(run_name="mr-app")
    before = {c.key for c in open_connections()}
    chain.invoke([{"doc": "a"}, {"doc": "b"}])
    assert [key[2] for key in {c.key for c in open_connections()} - before] == ["mr-app"]


def test_a_closed_shared_session_is_replaced(chat: ChatEclectus) -> None:
    """After the shared session closes, the next call opens a fresh one and succeeds."""
    expected = chat.invoke("again").content
    connection = connection_for(chat.eclectus_url, chat.token, None)
    session = connection.session
    session.close()
    assert chat.invoke("again").content == expected
    assert connection.session is not session and not connection.session.closed


def gets_by(server: EclectusServer, criteria: str) -> int:
    histogram = server.metrics.get_latency.get(criteria)
    return histogram.count if histogram is not None else 0


def test_criteria_reach_the_scheduler(eclectus_server: EclectusServer) -> None:
    """A model's ``criteria`` is what its gets ask for: eager, batched, streamed, compiled."""
    from eclectus.adapters.langchain import compile

    background = ChatEclectus(max_tokens=4, temperature=0, criteria="throughput")
    before = gets_by(eclectus_server, "throughput")
    background.invoke("a")
    background.batch(["b", "c"])
    "".join(str(chunk.content) for chunk in background.stream("d"))
    assert gets_by(eclectus_server, "throughput") - before == 4

    urgent = EclectusLLM(max_tokens=4, temperature=0, criteria="deadline", deadline_ms=5000)
    chain = PromptTemplate.from_template("Q: {q}\nA:") | urgent | StrOutputParser()
    before = gets_by(eclectus_server, "deadline")
    assert compile(chain).invoke({"q": "x"}) == chain.invoke({"q": "x"})
    assert gets_by(eclectus_server, "deadline") - before == 2


def test_deadline_criteria_needs_its_deadline() -> None:
    """criteria='deadline' without deadline_ms (or the reverse) is refused at construction."""
    with pytest.raises(ValueError, match="deadline_ms"):
        ChatEclectus(criteria="deadline")
    with pytest.raises(ValueError, match="deadline_ms"):
        ChatEclectus(deadline_ms=100)


@pytest.mark.parametrize("model_class", [ChatEclectus, EclectusLLM])
def test_leaving_a_stream_early_aborts_the_generation(
    eclectus_server: EclectusServer, model_class: type
) -> None:
    """Breaking out of LangChain's ``stream`` closes the SDK stream under it: the server
    cancels the call and the engine stops (docs/sdk.md, "Abandoned streams")."""
    model = model_class(max_tokens=4000, model_kwargs={"ignore_eos": True})
    cancelled = metric(eclectus_server, "eclectus_calls_cancelled_total")
    generated = metric(eclectus_server, "eclectus_generated_tokens_total")
    for _chunk in model.stream("Go on:"):
        break
    deadline = time.monotonic() + 10
    while metric(eclectus_server, "eclectus_engine_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(eclectus_server, "eclectus_calls_cancelled_total") == cancelled + 1
    assert metric(eclectus_server, "eclectus_engine_running") == 0
    assert metric(eclectus_server, "eclectus_generated_tokens_total") - generated < 2000


async def test_leaving_an_async_stream_early_aborts_the_generation(
    eclectus_server: EclectusServer,
) -> None:
    """The async twin: ``break`` out of ``astream``; the loop finalizes the generators."""
    model = ChatEclectus(max_tokens=4000, model_kwargs={"ignore_eos": True})
    cancelled = metric(eclectus_server, "eclectus_calls_cancelled_total")
    async for _chunk in model.astream("Go on:"):
        break
    deadline = time.monotonic() + 10
    while metric(eclectus_server, "eclectus_calls_cancelled_total") == cancelled:
        assert time.monotonic() < deadline, "the abandoned stream was not cancelled"
        await asyncio.sleep(0.05)
    assert metric(eclectus_server, "eclectus_calls_cancelled_total") == cancelled + 1
