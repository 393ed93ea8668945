"""The Eclectus LlamaIndex LLM against a real local server with the built-in engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.prompts import PromptTemplate
from llamaindex_support import TEST_CONTEXT_WINDOW, TEST_MAX_TOKENS

from eclectus.adapters.llamaindex import Eclectus
from eclectus.adapters.llamaindex.prompts import messages_to_prompt
from eclectus.protocol import CLIENT_FRAME, Submit, TextSegment, VarSegment
from eclectus.server.front.app import EclectusServer

MESSAGES = [
    ChatMessage(role=MessageRole.SYSTEM, content="You answer briefly."),
    ChatMessage(role=MessageRole.USER, content="Name a colour."),
]
TEMPLATE = PromptTemplate("Context:\n{context_str}\nQuestion: {query_str}\nAnswer:")
ARGS = {"context_str": "The sky is blue.", "query_str": "What colour is the sky?"}


class _FrameRecorder(logging.Handler):
    """Parses each frame the SDK's wire log (DEBUG) reports sent."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.frames: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        assert isinstance(record.args, tuple)
        self.frames.append(CLIENT_FRAME.validate_json(record.args[0]))


@pytest.fixture
def sent_frames() -> Iterator[list[Any]]:
    """Every frame the SDK sends, as it sends it."""
    logger = logging.getLogger("eclectus.adapters.client.wire")
    recorder, level = _FrameRecorder(), logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.DEBUG)
    try:
        yield recorder.frames
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(level)


def test_metadata_comes_from_the_server(server: EclectusServer, llm: Eclectus) -> None:
    """Model name and context window are the server's; num_output is max_tokens, or -1
    without one (LlamaIndex's OpenAI LLM says the same: nothing reserved)."""
    plain = Eclectus(url=server.url)
    try:
        assert plain.metadata.context_window == server.model.context_window
        assert plain.metadata.model_name == server.model.name == "tiny"
        assert plain.max_tokens is None and plain.metadata.num_output == -1
        assert not plain.metadata.is_chat_model
    finally:
        plain.close()
    assert llm.metadata.context_window == TEST_CONTEXT_WINDOW
    assert llm.metadata.num_output == TEST_MAX_TOKENS


def test_unknown_model_is_refused(server: EclectusServer) -> None:
    other = Eclectus(url=server.url, model="no-such-model")
    try:
        with pytest.raises(ValueError, match="no-such-model"):
            _ = other.metadata
    finally:
        other.close()


async def test_complete_sync_async_and_streams_agree(llm: Eclectus) -> None:
    """Greedy decoding: every entry point gives the same text; streams concatenate to it."""
    text = (await llm.acomplete("Once upon a time")).text
    assert text, "the tiny model generates something within max_tokens"
    assert llm.complete("Once upon a time").text == text
    streamed = [r async for r in await llm.astream_complete("Once upon a time")]
    assert "".join(r.delta or "" for r in streamed) == text
    assert streamed[-1].text == text
    assert "".join(r.delta or "" for r in llm.stream_complete("Once upon a time")) == text


async def test_usage_is_reported(llm: Eclectus) -> None:
    response = await llm.acomplete("Count:")
    assert response.additional_kwargs["prompt_tokens"] > 0
    assert 0 < response.additional_kwargs["completion_tokens"] <= TEST_MAX_TOKENS


def test_token_counting_handler_counts_the_servers_tokens(llm: Eclectus) -> None:
    """LlamaIndex's TokenCountingHandler reads the server's counts, not its own estimate
    (its tokenizer here splits on spaces, so an estimate would differ)."""
    counter = TokenCountingHandler(tokenizer=str.split)
    llm.callback_manager = CallbackManager([counter])
    completion = llm.complete("Once upon a time")
    chat = llm.chat([ChatMessage(role=MessageRole.USER, content="Say hello.")])
    usage = [completion.additional_kwargs, chat.additional_kwargs]
    assert [e.prompt_token_count for e in counter.llm_token_counts] == [
        u["prompt_tokens"] for u in usage
    ]
    assert [e.completion_token_count for e in counter.llm_token_counts] == [
        u["completion_tokens"] for u in usage
    ]


async def test_async_methods_never_call_the_sync_ones(
    llm: Eclectus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """acomplete/achat/astream_* await the SDK directly (no sync method in a thread)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a sync method was called from the async API")

    expected = llm.complete("Hello").text
    for name in ("complete", "stream_complete", "chat", "stream_chat"):
        monkeypatch.setattr(Eclectus, name, refuse)
    assert (await llm.acomplete("Hello")).text == expected
    assert (await llm.achat(MESSAGES)).message.content
    assert [r async for r in await llm.astream_chat(MESSAGES)]


async def test_concurrent_calls_share_one_session(llm: Eclectus) -> None:
    """Concurrent acomplete calls run together and each gets its own prompt's answer."""
    prompts = [f"Item {i}:" for i in range(4)]
    one_by_one = [(await llm.acomplete(p)).text for p in prompts]
    together = await asyncio.gather(*(llm.acomplete(p) for p in prompts))
    assert [r.text for r in together] == one_by_one


async def test_chat_uses_the_model_chat_template(llm: Eclectus) -> None:
    """Chat messages reach the model as "<|role|>\\ncontent\\n"... "<|assistant|>\\n"."""
    expected = llm.complete(messages_to_prompt(MESSAGES), formatted=True).text
    assert llm.chat(MESSAGES).message.content == expected
    assert (await llm.achat(MESSAGES)).message.content == expected
    assert "".join(r.delta or "" for r in llm.stream_chat(MESSAGES)) == expected
    streamed = [r async for r in await llm.astream_chat(MESSAGES)]
    assert streamed[-1].message.content == expected
    assert streamed[-1].message.role == MessageRole.ASSISTANT


async def test_predict_equals_completing_the_formatted_prompt(llm: Eclectus) -> None:
    """Prompt capture changes how the prompt travels, not what the model reads."""
    expected = llm.complete(TEMPLATE.format(**ARGS), formatted=True).text
    assert llm.predict(TEMPLATE, **ARGS) == expected
    assert await llm.apredict(TEMPLATE, **ARGS) == expected
    assert "".join(llm.stream(TEMPLATE, **ARGS)) == expected
    assert "".join([t async for t in await llm.astream(TEMPLATE, **ARGS)]) == expected


async def test_predict_sends_template_text_and_variables_as_segments(
    llm: Eclectus, sent_frames: list[Any]
) -> None:
    """The server receives the template's constant text as text segments and each
    variable as a named variable segment, in template order."""
    await llm.apredict(TEMPLATE, **ARGS)
    (submit,) = [f for f in sent_frames if isinstance(f, Submit) and f.calls]
    (call,) = submit.calls
    values = {v.id: (v.name, v.value) for v in submit.vars if v.value is not None}
    kinds = [
        ("text", s.text)
        if isinstance(s, TextSegment)
        else ("var", values[s.var])
        if isinstance(s, VarSegment)
        else ("gen", s.sampling.max_tokens)
        for s in call.segments or []
    ]
    assert kinds == [
        ("text", "Context:\n"),
        ("var", ("context_str", ARGS["context_str"])),
        ("text", "\nQuestion: "),
        ("var", ("query_str", ARGS["query_str"])),
        ("text", "\nAnswer:"),
        ("gen", TEST_MAX_TOKENS),
    ]


async def test_per_call_sampling_overrides(llm: Eclectus) -> None:
    """max_tokens given to one call bounds that call only."""
    short = await llm.acomplete("Once upon a time", max_tokens=3)
    assert 0 < short.additional_kwargs["completion_tokens"] <= 3
    full = await llm.acomplete("Once upon a time")
    assert full.text.encode().startswith(short.text.encode().rstrip(b"\xef\xbf\xbd"))
