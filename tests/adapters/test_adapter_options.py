"""Every path of both framework adapters carries every option, over the one shared client
layer, against the recording peer (a real WebSocket server speaking the protocol):

- defaults: no hidden max_tokens anywhere (the contract's None: until EOS or the window);
- every contract sampling field reaches the wire from every adapter;
- criteria and deadline_ms reach every get, streams included;
- request_timeout bounds a stream's wait, async streams included;
- a lost connection is retried; http:// URLs are converted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from client_peer import FakePeer
from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompts import PromptTemplate
from llama_index.core.base.llms.types import ChatMessage
from peer_frames import sent_gets, sent_sampling

from eclectus.adapters.client import ConnectionError as ClientConnectionError
from eclectus.adapters.langchain import ChatEclectus, EclectusLLM
from eclectus.adapters.langchain import compile as compile_chain
from eclectus.adapters.llamaindex import Eclectus
from eclectus.protocol import SamplingParams

# One non-default value per contract field: a field added to SamplingParams must be added
# here, and the tests below then prove every adapter carries it without adapter changes.
SAMPLE_VALUES: dict[str, Any] = {
    "max_tokens": 5,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 3,
    "seed": 11,
    "stop": ("END",),
    "stop_token_ids": (2,),
    "ignore_eos": True,
    "structured_outputs": {"regex": "[a-z]{1,5}"},
    "skip_special_tokens": False,
}
EVERY_FIELD = SamplingParams(**SAMPLE_VALUES)
OUTER_LIMIT_S = 20.0  # a test that hangs fails here instead


def lc_models(url: str, **options: Any) -> list[BaseLanguageModel]:
    return [ChatEclectus(base_url=url, **options), EclectusLLM(base_url=url, **options)]


def li_model(url: str, **options: Any) -> Eclectus:
    return Eclectus(url=url, **options)


# -- the paths of each adapter ------------------------------------------------------------


def lc_paths(model: BaseLanguageModel) -> dict[str, Callable[[], Any]]:
    return {
        "invoke": lambda: model.invoke("hi"),
        "ainvoke": lambda: asyncio.run(model.ainvoke("hi")),
        "stream": lambda: list(model.stream("hi")),
        "astream": lambda: asyncio.run(_drain(model.astream("hi"))),
        "batch": lambda: model.batch(["hi", "ho"]),
    }


def li_paths(llm: Eclectus) -> dict[str, Callable[[], Any]]:
    chat = [ChatMessage(role="user", content="hi")]
    return {
        "complete": lambda: llm.complete("hi"),
        "acomplete": lambda: asyncio.run(llm.acomplete("hi")),
        "stream_complete": lambda: list(llm.stream_complete("hi")),
        "astream_complete": lambda: asyncio.run(_adrain(llm.astream_complete("hi"))),
        "chat": lambda: llm.chat(chat),
        "achat": lambda: asyncio.run(llm.achat(chat)),
        "stream_chat": lambda: list(llm.stream_chat(chat)),
        "astream_chat": lambda: asyncio.run(_adrain(llm.astream_chat(chat))),
    }


async def _drain(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


async def _adrain(started: Any) -> list[Any]:
    return [item async for item in await started]


def every_path(url: str, **options: Any) -> Iterator[tuple[str, Callable[[], Any]]]:
    for model in lc_models(url, **options.get("langchain", {})):
        for name, run in lc_paths(model).items():
            yield f"{type(model).__name__}.{name}", run
    for name, run in li_paths(li_model(url, **options.get("llamaindex", {}))).items():
        yield f"Eclectus.{name}", run


# -- defaults -------------------------------------------------------------------------------


def test_no_adapter_path_has_a_hidden_max_tokens(peer: FakePeer) -> None:
    """Without max_tokens, every path of both adapters sends none: the contract's default
    (until EOS or the context window), as ChatOpenAI against vLLM."""
    for name, run in every_path(peer.url):
        before = len(sent_sampling(peer))
        run()
        sent = sent_sampling(peer)[before:]
        assert sent and all(s == SamplingParams() for s in sent), name


def test_llamaindex_num_output_without_max_tokens(peer: FakePeer) -> None:
    """num_output is -1 with max_tokens None, as LlamaIndex's own OpenAI LLM reports."""
    assert li_model(peer.url).metadata.num_output == -1
    assert li_model(peer.url, max_tokens=9).metadata.num_output == 9


# -- every sampling field, every path -------------------------------------------------------


def test_sample_values_cover_the_contract() -> None:
    assert set(SAMPLE_VALUES) == set(SamplingParams.model_fields)


def test_every_contract_field_reaches_the_wire_from_every_path(peer: FakePeer) -> None:
    """All SamplingParams fields, given as extra keyword settings (LangChain's
    ``model_kwargs``, LlamaIndex's ``additional_kwargs``), arrive unchanged."""
    options = {
        "langchain": {"model_kwargs": dict(SAMPLE_VALUES)},
        "llamaindex": {"additional_kwargs": dict(SAMPLE_VALUES)},
    }
    for name, run in every_path(peer.url, **options):
        before = len(sent_sampling(peer))
        run()
        sent = sent_sampling(peer)[before:]
        assert sent and all(s == EVERY_FIELD for s in sent), name


def test_call_time_keywords_reach_the_wire(peer: FakePeer) -> None:
    """Call-time keywords override the settings with any contract field."""
    ChatEclectus(base_url=peer.url, max_tokens=50).invoke("hi", **SAMPLE_VALUES)
    li_model(peer.url, max_tokens=50).complete("hi", **SAMPLE_VALUES)
    assert sent_sampling(peer) == [EVERY_FIELD, EVERY_FIELD]


def test_named_fields_match_the_contract(peer: FakePeer) -> None:
    """The named constructor fields (ignore_eos included for LlamaIndex) reach the wire."""
    # given through model_kwargs etc. (vLLM's extra_body fields, as on langchain-openai)
    unnamed = ("stop_token_ids", "structured_outputs", "skip_special_tokens")
    named = {k: v for k, v in SAMPLE_VALUES.items() if k not in unnamed}
    li_model(peer.url, **{**named, "stop": ["END"]}).complete("x")
    lc_named = {k: v for k, v in named.items() if k not in ("ignore_eos", "stop")}
    ChatEclectus(base_url=peer.url, stop=["END"], **lc_named).invoke("x")
    defaults = {"stop_token_ids": (), "structured_outputs": None, "skip_special_tokens": True}
    expected = EVERY_FIELD.model_copy(update=defaults)
    assert sent_sampling(peer)[0] == expected
    assert sent_sampling(peer)[1] == expected.model_copy(update={"ignore_eos": False})


def test_out_of_range_settings_fail_at_construction() -> None:
    """A sampling value the contract refuses is a ValueError naming the field, at once."""
    with pytest.raises(ValueError, match="temperature"):
        ChatEclectus(temperature=99)
    with pytest.raises(ValueError, match="top_k"):
        Eclectus(top_k=0)
    with pytest.raises(ValueError, match="not a sampling option"):
        Eclectus(additional_kwargs={"frequency_penalty": 1})


# -- criteria and deadline ------------------------------------------------------------------


def test_every_path_carries_criteria_and_deadline(peer: FakePeer) -> None:
    """A deadline model's gets say criteria 'deadline' and its deadline_ms on every path,
    streams included."""
    objective = {"criteria": "deadline", "deadline_ms": 1234}
    options = {"langchain": objective, "llamaindex": objective}
    for name, run in every_path(peer.url, **options):
        before = len(sent_gets(peer))
        run()
        gets = sent_gets(peer)[before:]
        assert gets, name
        assert all((g["criteria"], g.get("deadline_ms")) == ("deadline", 1234) for g in gets), (
            name,
            gets,
        )


def test_compiled_chains_carry_criteria_and_deadline(peer: FakePeer) -> None:
    """A compiled chain's gets, its stream's included, carry the model's objective."""
    model = ChatEclectus(base_url=peer.url, criteria="deadline", deadline_ms=777, max_tokens=4)
    chain = compile_chain(PromptTemplate.from_template("Q: {q}") | model)
    chain.invoke({"q": "a"})
    list(chain.stream({"q": "b"}))
    asyncio.run(_drain(chain.astream({"q": "c"})))
    gets = sent_gets(peer)
    assert len(gets) == 3
    assert all((g["criteria"], g["deadline_ms"]) == ("deadline", 777) for g in gets), gets


def test_deadline_and_criteria_go_together() -> None:
    with pytest.raises(ValueError, match="deadline_ms"):
        Eclectus(criteria="deadline")
    with pytest.raises(ValueError, match="deadline_ms"):
        EclectusLLM(deadline_ms=10)


# -- request timeout ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ChatEclectus", "EclectusLLM", "Eclectus"])
async def test_async_streams_honour_request_timeout(peer: FakePeer, kind: str) -> None:
    """An async stream whose server never answers raises TimeoutError after
    request_timeout, as the blocking stream does (it used to wait forever)."""
    peer.hold_gets = True

    async def consume() -> None:
        if kind == "Eclectus":
            stream = await li_model(peer.url, request_timeout=0.3).astream_complete("hi")
        else:
            model = {"ChatEclectus": ChatEclectus, "EclectusLLM": EclectusLLM}[kind]
            stream = model(base_url=peer.url, timeout=0.3).astream("hi")
        async for _ in stream:
            pass

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(OUTER_LIMIT_S) as outer:
            await consume()
    assert not outer.expired(), "the outer limit fired, not the model's"


@pytest.mark.parametrize("kind", ["ChatEclectus", "Eclectus"])
def test_blocking_streams_honour_request_timeout(peer: FakePeer, kind: str) -> None:
    """The blocking streams of both adapters give up after request_timeout."""
    peer.hold_gets = True
    if kind == "Eclectus":
        stream: Any = li_model(peer.url, request_timeout=0.3).stream_complete("hi")
    else:
        stream = ChatEclectus(base_url=peer.url, timeout=0.3).stream("hi")
    with pytest.raises(TimeoutError):
        list(stream)


async def test_llamaindex_acomplete_honours_request_timeout(peer: FakePeer) -> None:
    peer.hold_gets = True
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(OUTER_LIMIT_S) as outer:
            await li_model(peer.url, request_timeout=0.3).acomplete("hi")
    assert not outer.expired(), "the outer limit fired, not the model's"


# -- retries and URLs -----------------------------------------------------------------------


def test_every_path_retries_after_a_lost_connection(peer: FakePeer) -> None:
    """The server drops the connection at the first submit of each path: the call is
    declared again on a fresh session and succeeds."""
    for name, run in every_path(peer.url):
        peer.drop_submits = 1
        run()
        assert peer.drop_submits == 0, name


def test_no_retries_means_the_lost_connection_is_raised(peer: FakePeer) -> None:
    """With max_retries=0 the lost connection reaches the caller, on both adapters."""
    for run in (
        lambda: li_model(peer.url, max_retries=0).complete("hi"),
        lambda: ChatEclectus(base_url=peer.url, max_retries=0).invoke("hi"),
    ):
        peer.drop_submits = 1
        with pytest.raises(ClientConnectionError):
            run()


def test_http_urls_are_converted(peer: FakePeer) -> None:
    """An http:// base URL with an OpenAI-style /v1 suffix reaches the WebSocket server,
    on both adapters."""
    http_url = peer.url.replace("ws://", "http://") + "/v1"
    assert li_model(http_url).complete("hi").text
    assert ChatEclectus(base_url=http_url).invoke("hi").content
    assert len(peer.of_type("hello")) == 2
