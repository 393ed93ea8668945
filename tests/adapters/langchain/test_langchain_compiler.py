"""Differential tests of the chain compiler: for every supported shape, the compiled chain
and the same chain run eagerly, on the same model with greedy decoding, give identical
outputs; a compiled run sends one frame whatever the fan-out; cuts run on the client."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough, RunnablePick
from lc_helpers import metric

from eclectus.adapters.langchain import ChatEclectus, EclectusLLM, compile
from eclectus.server.front.app import EclectusServer

FRAMES = "eclectus_client_frames_total"


@pytest.fixture
def chat(eclectus_server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(max_tokens=5, temperature=0, model_kwargs={"ignore_eos": True})


@pytest.fixture
def llm(eclectus_server: EclectusServer) -> EclectusLLM:
    return EclectusLLM(max_tokens=5, temperature=0, model_kwargs={"ignore_eos": True})


def plain(value: Any) -> Any:
    """Outputs compared by what they say: a message by its content."""
    if isinstance(value, AIMessage):
        return ("AIMessage", value.content)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def assert_same(chain: Runnable, value: Any) -> Any:
    """Eager and compiled invoke agree; returns the compiled runnable's output."""
    eager = chain.invoke(value)
    compiled = compile(chain).invoke(value)
    assert plain(compiled) == plain(eager)
    return compiled


def summarize_chain(model: ChatEclectus) -> Runnable:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Summarize in one line."), ("human", "Text: {doc}")]
    )
    return prompt | model | StrOutputParser()


def map_reduce_chain(model: ChatEclectus) -> Runnable:
    # the list starts a line: a segment boundary after a space would split the BPE
    # pre-token " [" that the eager run's single text makes, and the ids would differ
    reduce_prompt = PromptTemplate.from_template("Combine these summaries:\n{summaries}\nFinal:")
    docs_to_summaries = RunnableLambda(lambda d: d["docs"]) | summarize_chain(model).map()
    return {"summaries": docs_to_summaries} | reduce_prompt | model | StrOutputParser()


@pytest.mark.parametrize(
    ("template", "fmt"),
    [("Q: {q}\nA:", "f-string"), ("Q: {{{q}}}\nA:", "mustache"), ("Q: {{ q }}\nA:", "jinja2")],
)
def test_prompt_model_parser(chat: ChatEclectus, template: str, fmt: str) -> None:
    """PromptTemplate (each format) | chat model | StrOutputParser."""
    chain = PromptTemplate.from_template(template, template_format=fmt) | chat | StrOutputParser()
    assert isinstance(assert_same(chain, {"q": "why <sky> & sea"}), str)


def test_chat_prompt_with_history_returns_the_same_message(chat: ChatEclectus) -> None:
    """System/human/AI messages and a MessagesPlaceholder; the output is an AIMessage."""
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are {role}."),
            MessagesPlaceholder("history"),
            ("human", "{q}"),
            ("ai", "Let me think."),
        ]
    )
    history = [HumanMessage("hi"), AIMessage("hello")]
    out = assert_same(prompt | chat, {"role": "terse", "history": history, "q": "why?"})
    assert isinstance(out, AIMessage) and out.usage_metadata is not None
    assert out.response_metadata["model_name"] == "tiny"


def test_completion_model_with_string_and_chat_prompts(llm: EclectusLLM) -> None:
    """EclectusLLM after a PromptTemplate and after a ChatPromptTemplate (Role: lines)."""
    assert_same(PromptTemplate.from_template("Title: {t}\nStory:") | llm, {"t": "Rain"})
    chat_prompt = ChatPromptTemplate.from_messages([("system", "Be {x}."), ("human", "{q}")])
    assert_same(chat_prompt | llm, {"x": "kind", "q": "hello"})


def test_bind_arguments_reach_the_call(chat: ChatEclectus) -> None:
    """.bind(max_tokens=..., stop=...) changes the compiled call exactly as the eager one."""
    chain = PromptTemplate.from_template("{q}") | chat.bind(max_tokens=2, stop=["zz"])
    out = assert_same(chain, {"q": "hey"})
    assert out.usage_metadata["output_tokens"] <= 2


def test_parallel_dict_passthrough_assign_pick(chat: ChatEclectus) -> None:
    """Dict literals, RunnableParallel, passthrough, .assign and .pick route values."""
    summary = summarize_chain(chat)
    chain = RunnablePassthrough.assign(first=summary) | {
        "first": lambda d: d["first"],
        "doc": RunnablePassthrough().pick("doc"),
        "second": PromptTemplate.from_template("Again: {first}") | chat | StrOutputParser(),
    }
    out = assert_same(chain, {"doc": "the cat sat"})
    assert set(out) == {"first", "doc", "second"}


def test_assign_refine_chain_is_one_frame_without_cuts(
    eclectus_server: EclectusServer, llm: EclectusLLM
) -> None:
    """A refine chain of .assign steps (whose mapper LangChain builds as the parametrized
    class ``RunnableParallel[dict[str, Any]]``) lowers entirely onto the server: no cut in
    the plan or the run, three calls, one client frame, the eager chain's answer."""
    refine = PromptTemplate.from_template("So far: {summary}\nAdd: {text}\n") | llm
    chain: Runnable = RunnablePassthrough.assign(
        summary={"text": RunnablePick("c0")} | PromptTemplate.from_template("{text}") | llm
    )
    for i in (1, 2):
        step = {"summary": RunnablePick("summary"), "text": RunnablePick(f"c{i}")} | refine
        chain = chain | RunnablePassthrough.assign(summary=step | StrOutputParser())
    chain = chain | RunnablePick("summary")
    inputs = {"c0": "one", "c1": "two", "c2": "three"}
    compiled = compile(chain)
    assert "CUT" not in compiled.plan()
    eager = chain.invoke(inputs)
    compiled.invoke(inputs)  # opens the session
    before = metric(eclectus_server, FRAMES)
    assert compiled.invoke(inputs) == eager
    assert metric(eclectus_server, FRAMES) - before == 1
    assert compiled.last_graph is not None
    assert compiled.last_graph.cuts == [] and compiled.last_graph.num_calls == 3


def test_map_reduce_renders_the_list_like_python(
    eclectus_server: EclectusServer, chat: ChatEclectus
) -> None:
    """.map() over a list, its outputs dropped into a reduce prompt as str(list): the
    server's repr_list op must be byte-identical to Python's rendering."""
    chain = map_reduce_chain(chat)
    docs = {"docs": ["it's one", 'say "two"', "back\\slash\nnewline", "é ünïcode"]}
    assert_same(chain, docs)
    compiled = compile(chain)
    compiled.invoke(docs)
    assert compiled.last_graph is not None
    assert compiled.last_graph.num_calls == 5 and compiled.last_graph.num_ops == 1


def test_frames_do_not_grow_with_fan_out(
    eclectus_server: EclectusServer, chat: ChatEclectus
) -> None:
    """A compiled map-reduce without cuts sends one frame for 2 documents and for 8."""
    reduce_prompt = PromptTemplate.from_template("All: {summaries}")
    chain = compile({"summaries": summarize_chain(chat).map()} | reduce_prompt | chat)
    chain.invoke(["warm", "up"])  # opens the session
    frames = []
    for width in (2, 8):
        before = metric(eclectus_server, FRAMES)
        chain.invoke([f"document {i}" for i in range(width)])
        frames.append(metric(eclectus_server, FRAMES) - before)
    assert frames == [1, 1]


def test_batch_of_a_chain_is_one_graph(eclectus_server: EclectusServer, chat: ChatEclectus) -> None:
    """.batch() of a compiled chain: independent paths, one frame, eager's answers."""
    chain = summarize_chain(chat)
    inputs = [{"doc": f"doc {i}"} for i in range(5)]
    eager = chain.batch(inputs)
    compiled = compile(chain)
    compiled.invoke(inputs[0])
    before = metric(eclectus_server, FRAMES)
    assert compiled.batch(inputs) == eager
    assert metric(eclectus_server, FRAMES) - before == 1


async def test_async_entry_points(chat: ChatEclectus) -> None:
    """ainvoke, abatch and astream give what the eager chain gives."""
    chain = summarize_chain(chat)
    compiled = compile(chain)
    eager = chain.invoke({"doc": "x"})
    assert await compiled.ainvoke({"doc": "x"}) == eager
    assert await compiled.abatch([{"doc": "x"}, {"doc": "y"}]) == chain.batch(
        [{"doc": "x"}, {"doc": "y"}]
    )
    assert "".join([c async for c in compiled.astream({"doc": "x"})]) == eager


def test_stream_yields_text_then_message_chunks(chat: ChatEclectus) -> None:
    """stream() of a string chain yields str deltas; of a message chain, AIMessageChunks
    ending with a last chunk that carries usage."""
    chain = summarize_chain(chat)
    assert "".join(compile(chain).stream({"doc": "x"})) == chain.invoke({"doc": "x"})
    prompt = PromptTemplate.from_template("{doc}")
    chunks = list(compile(prompt | chat).stream({"doc": "x"}))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata is not None
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    assert total.content == (prompt | chat).invoke({"doc": "x"}).content


def test_cut_runs_the_function_on_the_client(chat: ChatEclectus) -> None:
    """A RunnableLambda between two model calls is a cut: the upstream call is resolved,
    the lambda runs on the client, and its result feeds the downstream call."""
    seen: list[str] = []

    def shout(text: str) -> dict[str, str]:
        seen.append(text)
        return {"q": text.upper()}

    chain = (
        summarize_chain(chat)
        | RunnableLambda(shout)
        | PromptTemplate.from_template("Loud: {q}")
        | chat
        | StrOutputParser()
    )
    compiled = compile(chain)
    assert compiled.invoke({"doc": "quiet"}) == chain.invoke({"doc": "quiet"})
    assert len(seen) == 2 and seen[0] == seen[1]
    explained = compiled.explain()
    assert "shout -> CUT (client)" in explained
    assert "CUT    shout: runs on the client" in explained


def test_mustache_escaping_of_a_generated_value_is_a_cut(chat: ChatEclectus) -> None:
    """{{x}} HTML-escapes; over a generated value the prompt cuts instead of going wrong."""
    downstream = PromptTemplate.from_template("Said: {{x}}", template_format="mustache")
    chain = {"x": summarize_chain(chat)} | downstream | chat | StrOutputParser()
    compiled = compile(chain)
    assert compiled.invoke({"doc": "<b>bold</b>"}) == chain.invoke({"doc": "<b>bold</b>"})
    assert compiled.last_graph is not None
    assert [name for name, _ in compiled.last_graph.cuts] == ["PromptTemplate"]


def test_errors_match_the_eager_chain(chat: ChatEclectus) -> None:
    """A missing prompt variable fails the compiled run as it fails the eager one."""
    chain = PromptTemplate.from_template("{a} {b}") | chat
    with pytest.raises(KeyError):
        chain.invoke({"a": "x"})
    with pytest.raises(KeyError):
        compile(chain).invoke({"a": "x"})


def test_compile_needs_an_eclectus_model() -> None:
    """Without an Eclectus model there is no server to compile for."""
    with pytest.raises(ValueError, match="ChatEclectus"):
        compile(PromptTemplate.from_template("{x}") | RunnableLambda(str))


def test_readme_map_reduce_example(eclectus_server: EclectusServer) -> None:
    """docs/langchain.md's map-reduce app: both styles give the same answer; the eager
    chain sends two frames (the map batch, the reduce), the compiled one sends one."""
    llm = ChatEclectus(model="tiny", temperature=0, max_tokens=12)
    map_prompt = ChatPromptTemplate.from_messages(
        [("system", "You summarize documents in one sentence."), ("human", "Document:\n{doc}")]
    )
    summarize = map_prompt | llm | StrOutputParser()
    reduce_prompt = PromptTemplate.from_template(
        "Here are summaries of several documents: {summaries}\n"
        "Write one paragraph that combines them:"
    )
    map_reduce = {"summaries": summarize.map()} | reduce_prompt | llm | StrOutputParser()
    inputs = [{"doc": d} for d in ["doc one", "doc two", "doc three"]]
    compiled = compile(map_reduce)
    map_reduce.invoke(inputs)  # opens the eager session
    compiled.invoke(inputs)  # and the compiled one
    before = metric(eclectus_server, FRAMES)
    eager = map_reduce.invoke(inputs)
    middle = metric(eclectus_server, FRAMES)
    assert compiled.invoke(inputs) == eager
    assert (middle - before, metric(eclectus_server, FRAMES) - middle) == (2, 1)


def test_batch_with_cuts_and_a_failing_input(chat: ChatEclectus) -> None:
    """A batch whose inputs each cut gives eager's outputs; with return_exceptions, a failing
    input's error comes back in its place and the others still answer."""
    chain = (
        summarize_chain(chat)
        | RunnableLambda(lambda text: {"q": text[::-1]})
        | PromptTemplate.from_template("Reversed: {q}")
        | chat
        | StrOutputParser()
    )
    inputs = [{"doc": "one"}, {"doc": "two"}]
    assert compile(chain).batch(inputs) == chain.batch(inputs)
    mixed = compile(chain).batch([{"doc": "one"}, {"nodoc": 1}], return_exceptions=True)
    assert mixed[0] == chain.invoke({"doc": "one"})
    assert isinstance(mixed[1], KeyError)


@pytest.mark.parametrize("limit", [1, 2])
def test_batch_cuts_keep_to_max_concurrency(chat: ChatEclectus, limit: int) -> None:
    """A sync batch's client cuts run at most ``max_concurrency`` at a time, as LangChain's
    own batch would run them."""
    lock, running, peak = threading.Lock(), [0], [0]

    def slow(text: str) -> dict[str, str]:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return {"q": text}

    chain = (
        summarize_chain(chat)
        | RunnableLambda(slow)
        | PromptTemplate.from_template("Again: {q}")
        | chat
        | StrOutputParser()
    )
    inputs = [{"doc": str(i)} for i in range(5)]
    outputs = compile(chain).batch(inputs, {"max_concurrency": limit})
    assert len(outputs) == len(inputs) and peak[0] == limit


def test_branches_and_fallbacks_are_cuts(chat: ChatEclectus) -> None:
    """RunnableBranch and with_fallbacks run on the client, fed by the server's graph."""
    from langchain_core.runnables import RunnableBranch

    upper = PromptTemplate.from_template("Loud: {q}") | chat.with_fallbacks([chat])
    branch = RunnableBranch(
        (lambda d: len(d["q"]) > 3, upper),
        PromptTemplate.from_template("Quiet: {q}") | chat,
    )
    chain = {"q": summarize_chain(chat)} | branch | StrOutputParser()
    compiled = compile(chain)
    assert compiled.invoke({"doc": "some text"}) == chain.invoke({"doc": "some text"})
    assert compiled.last_graph is not None
    assert [name for name, _ in compiled.last_graph.cuts] == ["RunnableBranch"]
    assert "RunnableBranch -> CUT (client)" in compiled.plan()


def test_server_list_rendering_is_pythons_repr(chat: ChatEclectus) -> None:
    """The op the compiler uses for str(list) gives Python's bytes for awkward strings."""
    import asyncio

    from eclectus.adapters.langchain.compiler.context import Lowering
    from eclectus.adapters.langchain.compiler.runnable import CompiledRunnable

    compiled = CompiledRunnable(chat, chat)
    ctx = Lowering(compiled._session(), compiled.server, "sync", {})
    generated = ctx.declare_call(["Say: "], {"max_tokens": 6, "ignore_eos": True}, None, "gen")
    awkward = ["it's", 'say "two"', "both ' and \"", "back\\slash\nnew\tline", "é ü 💡", ""]
    rendered = ctx.repr_list([generated, *awkward])
    text, listed = asyncio.run(ctx.resolve([generated, rendered]))
    assert listed == str([text, *awkward])
