"""Eclectus as a LlamaIndex FunctionCallingLLM, against the real server (tiny model): the
grammar enforces the mechanics (a forced call is made, its arguments fit the tool's schema),
whatever the model would choose."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llamaindex_support import QUESTION, SCHEMAS, TOOLS

from eclectus.adapters.llamaindex import Eclectus
from eclectus.adapters.llamaindex.tools import (
    calls_of,
    prepare_chat_with_tools,
    reply_message,
    tool_choice_of,
)
from eclectus.protocol.tools import ToolCall
from eclectus.server.front.app import EclectusServer


@pytest.fixture
def tool_llm(server: EclectusServer) -> Iterator[Eclectus]:
    """Room for a call's JSON; sampled, so that several seeds give different calls."""
    model = Eclectus(url=server.url, max_tokens=96, temperature=0.8, seed=7, app="li-tools")
    yield model
    model.close()


def check_calls(llm: Eclectus, message: ChatMessage, names: set[str]) -> list[Any]:
    """Every call names one of ``names`` and has arguments valid for its tool."""
    selections = llm.get_tool_calls_from_response(ChatResponse(message=message))
    assert selections
    for selection in selections:
        assert selection.tool_name in names and selection.tool_id.startswith("call_")
        jsonschema.validate(selection.tool_kwargs, SCHEMAS[selection.tool_name])
    return selections


def test_is_a_function_calling_llm(tool_llm: Eclectus) -> None:
    assert isinstance(tool_llm, FunctionCallingLLM)
    assert tool_llm.metadata.is_function_calling_model


def test_tool_choice_forms() -> None:
    """LlamaIndex's forms map onto OpenAI's (pure)."""
    named = {"type": "function", "function": {"name": "add"}}
    assert tool_choice_of(None, False) == "auto"
    assert tool_choice_of(None, True) == "required"
    assert tool_choice_of("any", False) == "required"
    assert tool_choice_of("none", True) == "none"
    assert tool_choice_of("add", False) == named
    assert tool_choice_of(named, False) == named
    with pytest.raises(ValueError, match="unsupported tool_choice"):
        tool_choice_of(3, False)


def test_prepare_chat_with_tools_builds_the_chat_kwargs() -> None:
    history = [ChatMessage(role=MessageRole.SYSTEM, content="Be brief.")]
    chat = prepare_chat_with_tools(TOOLS, QUESTION, history, False, True, None, {"seed": 1})
    assert [m.role for m in chat["messages"]] == [MessageRole.SYSTEM, MessageRole.USER]
    assert [t["function"]["name"] for t in chat["tools"]] == ["add", "weather"]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["seed"] == 1
    assert "tools" not in prepare_chat_with_tools([], QUESTION, None, False, False, None, {})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tool_required_gives_valid_calls(tool_llm: Eclectus, seed: int) -> None:
    response = tool_llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_required=True, seed=seed)
    (selection,) = check_calls(tool_llm, response.message, {"add", "weather"})  # not parallel
    assert response.message.additional_kwargs["tool_calls"][0]["id"] == selection.tool_id
    assert response.additional_kwargs["completion_tokens"] > 0  # usage, as for any chat
    assert response.message.additional_kwargs["prompt_tokens"] > 0


def test_named_tool_choice_calls_that_tool(tool_llm: Eclectus) -> None:
    response = tool_llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="weather")
    (selection,) = check_calls(tool_llm, response.message, {"weather"})
    assert isinstance(selection.tool_kwargs["city"], str)


def test_parallel_calls_allowed(tool_llm: Eclectus) -> None:
    """With parallel calls allowed every call is still well-formed (how many is the
    model's choice)."""
    response = tool_llm.chat_with_tools(
        TOOLS, user_msg=QUESTION, tool_required=True, allow_parallel_tool_calls=True
    )
    check_calls(tool_llm, response.message, {"add", "weather"})


def test_no_call_raises_only_when_asked(tool_llm: Eclectus) -> None:
    response = tool_llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="none")
    assert response.message.content and not calls_of(response.message)
    assert tool_llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="tool call"):
        tool_llm.get_tool_calls_from_response(response)


def test_streamed_calls_match_the_whole_reply(server: EclectusServer) -> None:
    """Greedy, so the streamed reply and the whole reply are the same text: the last
    streamed response carries the same calls; no response is sent for held-back text."""
    llm = Eclectus(url=server.url, max_tokens=96, app="li-tools-stream")
    whole = llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="add")
    responses = list(llm.stream_chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="add"))
    assert all(r.delta or calls_of(r.message) for r in responses)
    streamed = [(c.name, c.arguments) for c in calls_of(responses[-1].message)]
    assert streamed == [(c.name, c.arguments) for c in calls_of(whole.message)]
    assert streamed and streamed[0][0] == "add"


async def test_async_twins(tool_llm: Eclectus) -> None:
    response = await tool_llm.achat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="add")
    check_calls(tool_llm, response.message, {"add"})
    stream = await tool_llm.astream_chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="add")
    last = [r async for r in stream][-1]
    check_calls(tool_llm, last.message, {"add"})


def test_predict_and_call_runs_the_tool(tool_llm: Eclectus) -> None:
    out = tool_llm.predict_and_call(TOOLS, user_msg=QUESTION, tool_choice="add")
    (source,) = out.sources
    assert source.tool_name == "add" and not source.is_error
    assert out.response == str(source.raw_input["kwargs"]["a"] + source.raw_input["kwargs"]["b"])


def _round_trip_history(assistant: ChatMessage) -> list[ChatMessage]:
    return [
        ChatMessage(role=MessageRole.USER, content=QUESTION),
        assistant,
        ChatMessage(
            role=MessageRole.TOOL, content="5", additional_kwargs={"tool_call_id": "call_1"}
        ),
    ]


@pytest.mark.parametrize("form", ["blocks", "additional_kwargs"])
def test_tool_results_round_trip_through_the_template(tool_llm: Eclectus, form: str) -> None:
    """An assistant turn's calls (as ToolCallBlocks, or OpenAI-shaped in additional_kwargs)
    are written back as the model writes them, the tool result is a tool turn, and the
    tools open the prompt; the next turn runs on that history."""
    call = ToolCall("call_1", "add", {"a": 2, "b": 3})
    assistant = reply_message("", [call])
    if form == "additional_kwargs":
        assistant = ChatMessage(
            role=MessageRole.ASSISTANT, additional_kwargs=dict(assistant.additional_kwargs)
        )
    history = _round_trip_history(assistant)
    tools = [t.metadata.to_openai_tool() for t in TOOLS]
    prompt = "".join(tool_llm._message_segments(history, tools))
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in prompt
    assert "<|tool|>\n5\n" in prompt
    assert prompt.index('"name": "weather"') < prompt.index(QUESTION)
    assert prompt.endswith("<|assistant|>\n")
    reply = tool_llm.chat_with_tools(TOOLS, chat_history=history, tool_choice="none")
    assert reply.message.role == MessageRole.ASSISTANT and reply.message.content


def test_reply_message_shape() -> None:
    """Text block first, then one ToolCallBlock per call; calls_of reads them back."""
    calls = [ToolCall("call_a", "add", {"a": 1, "b": 2}), ToolCall("call_b", "weather", {})]
    message = reply_message("thinking", calls)
    assert message.content == "thinking"
    assert [type(b) for b in message.blocks[1:]] == [ToolCallBlock, ToolCallBlock]
    assert calls_of(message) == calls


def test_custom_messages_to_prompt_cannot_show_tools(server: EclectusServer) -> None:
    llm = Eclectus(url=server.url, messages_to_prompt=lambda ms: "".join(m.content for m in ms))
    with pytest.raises(ValueError, match="tools need the served chat template"):
        llm.chat_with_tools(TOOLS, user_msg=QUESTION)


def test_a_format_beside_tools_is_read_as_the_openai_endpoint_reads_it(
    tool_llm: Eclectus,
) -> None:
    """With tool_choice "auto" a structured_outputs format wins (tools shown, no calls
    parsed); with a forced choice the two conflict and the error names the field."""
    choice = {"choice": ["yes", "no"]}
    reply = tool_llm.chat_with_tools(TOOLS, user_msg=QUESTION, structured_outputs=choice)
    assert reply.message.content in ("yes", "no") and not calls_of(reply.message)
    with pytest.raises(ValueError, match="cannot be combined"):
        tool_llm.chat_with_tools(
            TOOLS, user_msg=QUESTION, tool_required=True, structured_outputs=choice
        )
