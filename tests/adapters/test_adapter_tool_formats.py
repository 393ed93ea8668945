"""The adapters speak the tool-call format the server announces (``ModelCard.tool_call_format``),
not Hermes by default: a real server started with ``tool_call_parser="llama3_json"`` (what
``eclectus serve --tool-call-parser llama3_json`` sets) over the tiny model, whose own
template is Hermes. The grammar the adapter sends makes the model write Llama-3 JSON calls;
the adapter reads them back, whole and streamed. Past calls and tool results reach a chat
template as its own ``tool_calls`` / ``tool_call_id`` fields."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from client_live import guaranteed_engine
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.tools import FunctionTool

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langchain._calls import ModelCore
from eclectus.adapters.langchain.chat_format import ChatTemplate
from eclectus.adapters.langchain.pieces import concrete_text
from eclectus.adapters.llamaindex import Eclectus
from eclectus.adapters.llamaindex.prompts import chat_pieces
from eclectus.protocol import ModelCard
from eclectus.protocol.tool_formats import tool_format
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

pytestmark = pytest.mark.slow

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "chat_templates"
MISTRAL_VARS = {"bos_token": "<s>", "eos_token": "</s>"}
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def li_add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module")
def llama_server() -> Iterator[EclectusServer]:
    """The tiny model served with Llama-3 JSON tool calls."""
    config = ServerConfig(port=0, model="tiny", tool_call_parser="llama3_json")
    with serve_in_thread(config, guaranteed_engine) as server:
        yield server


def chat_model(server: EclectusServer) -> ChatEclectus:
    return ChatEclectus(base_url=server.url, max_tokens=96, temperature=0.8, seed=3)


def check_add_calls(calls: list[dict[str, Any]]) -> None:
    assert calls
    for call in calls:
        assert call["name"] == "add" and call["id"]
        jsonschema.validate(call["args"], ADD_SCHEMA)


# -- the card -------------------------------------------------------------------------------


def test_a_card_without_the_format_gets_its_templates() -> None:
    """An older server's card (no tool_call_format) still parses: the template's format."""
    mistral = (TEMPLATES / "mistral.jinja").read_text()
    old = ModelCard.model_validate({"name": "m", "context_window": 8})
    assert old.tool_call_format == "hermes"
    card = ModelCard.model_validate({"name": "m", "context_window": 8, "chat_template": mistral})
    assert card.tool_call_format == "mistral"
    assert card.with_tool_call_format("llama3_json").tool_call_format == "llama3_json"
    assert card.with_tool_call_format(None) is card
    with pytest.raises(ValueError, match="tool_call_format"):
        card.with_tool_call_format("xml")  # type: ignore[arg-type]


def test_the_server_announces_the_parser_it_was_given(llama_server: EclectusServer) -> None:
    """The welcome's card says llama3_json although the model's template is Hermes."""
    llm = Eclectus(url=llama_server.url, app="fmt-card")
    try:
        assert llm._model_info().tool_call_format == "llama3_json"
    finally:
        llm.close()


# -- LangChain ------------------------------------------------------------------------------


def test_langchain_forced_call_is_written_and_read_as_llama3_json(
    llama_server: EclectusServer,
) -> None:
    """The adapter's constraint makes the model write a Llama-3 JSON call (a Hermes reader
    finds none in the raw text) and ``invoke`` parses it into AIMessage.tool_calls."""
    chat = chat_model(llama_server)
    bound = chat.bind_tools([add], tool_choice="add")
    message = bound.invoke("Add 2 and 3.")
    assert isinstance(message, AIMessage)
    check_add_calls(message.tool_calls)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    # the raw reply of the same request (the call path ChatEclectus takes)
    core = ModelCore(chat, None)
    kwargs = {"tools": bound.kwargs["tools"], "tool_choice": bound.kwargs["tool_choice"]}
    messages = [HumanMessage("Add 2.")]
    (pieces, sampling, model), constraint = chat._call(messages, None, kwargs, core, None)
    assert constraint.tool_format == "llama3_json"
    (result,) = core.block(lambda: core.arun([(pieces, sampling)], model))
    assert result.text.lstrip().startswith('{"name": "add", "parameters": ')
    assert tool_format("hermes").parse(result.text)[1] == []
    assert [c.name for c in tool_format("llama3_json").parse(result.text)[1]] == ["add"]


def test_langchain_streamed_chunks_add_up_to_the_calls(llama_server: EclectusServer) -> None:
    """Streamed tool_call_chunks aggregate to well-formed calls of the Llama-3 reply."""
    bound = chat_model(llama_server).bind_tools([add], tool_choice="add")
    chunks = list(bound.stream("Add 2 and 3."))
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert full.tool_call_chunks and "parameters" not in str(full.content)
    check_add_calls(full.tool_calls)
    assert full.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_round_trip_reaches_the_template_as_its_fields(
    llama_server: EclectusServer,
) -> None:
    """AIMessage.tool_calls and ToolMessage.tool_call_id reach the template as
    ``tool_calls`` / ``tool_call_id``: Mistral's template writes the call and the id in its
    own syntax, Llama's writes the call as JSON; the live server answers the history."""
    call = {"name": "add", "args": {"a": 1, "b": 2}, "id": "abcDEF123", "type": "tool_call"}
    history = [
        HumanMessage("add 1 and 2"),
        AIMessage(content="", tool_calls=[call]),
        ToolMessage("3", tool_call_id="abcDEF123"),
    ]
    chat = chat_model(llama_server)
    mistral = ChatTemplate((TEMPLATES / "mistral.jinja").read_text(), MISTRAL_VARS)
    prompt = concrete_text(chat.prompt_pieces(history, mistral))
    assert '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abcDEF123"}]' in (
        prompt
    )
    assert '"call_id": "abcDEF123"' in prompt and "<tool_call>" not in prompt
    llama = ChatTemplate((TEMPLATES / "llama3_json.jinja").read_text())
    prompt = concrete_text(chat.prompt_pieces(history, llama))
    assert '{"name": "add", "parameters": {"a": 1, "b": 2}}' in prompt
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n3" in prompt
    reply = chat.bind_tools([add]).invoke(history)
    assert isinstance(reply, AIMessage)


# -- LlamaIndex -----------------------------------------------------------------------------


@pytest.fixture
def li_llm(llama_server: EclectusServer) -> Iterator[Eclectus]:
    llm = Eclectus(url=llama_server.url, max_tokens=96, temperature=0.8, seed=7, app="fmt-li")
    yield llm
    llm.close()


def test_llamaindex_chat_with_tools_reads_llama3_json(li_llm: Eclectus) -> None:
    """chat_with_tools with a named tool: the raw reply is a Llama-3 JSON call, parsed into
    ToolCallBlocks and ToolSelections."""
    tools = [FunctionTool.from_defaults(li_add, name="add")]
    response = li_llm.chat_with_tools(tools, "Add 2 and 3.", tool_choice="add")
    selections = li_llm.get_tool_calls_from_response(response)
    check_add_calls(
        [{"name": s.tool_name, "id": s.tool_id, "args": s.tool_kwargs} for s in selections]
    )
    kwargs = li_llm._prepare_chat_with_tools(tools, "Add 2.", tool_choice="add")
    build, constraint = li_llm._chat_build(kwargs.pop("messages"), kwargs)
    assert constraint.tool_format == "llama3_json"
    text = li_llm._fetch(build).text
    assert text.lstrip().startswith('{"name": "add", "parameters": ')
    assert tool_format("hermes").parse(text)[1] == []


def test_llamaindex_streamed_chat_with_tools_gives_the_same_calls(li_llm: Eclectus) -> None:
    """stream_chat_with_tools: the last response holds the parsed calls, no raw JSON."""
    tools = [FunctionTool.from_defaults(li_add, name="add")]
    *_, last = li_llm.stream_chat_with_tools(tools, "Add 2 and 3.", tool_choice="add")
    selections = li_llm.get_tool_calls_from_response(last)
    check_add_calls(
        [{"name": s.tool_name, "id": s.tool_id, "args": s.tool_kwargs} for s in selections]
    )
    assert "parameters" not in (last.message.content or "")


def test_llamaindex_tool_blocks_and_tool_messages_reach_the_template(li_llm: Eclectus) -> None:
    """An assistant ToolCallBlock and a MessageRole.TOOL message with its tool_call_id are
    rendered by Mistral's template in its own syntax; the live server answers them."""
    history = [
        ChatMessage(role=MessageRole.USER, content="add 1 and 2"),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[
                ToolCallBlock(
                    tool_call_id="abcDEF123", tool_name="add", tool_kwargs={"a": 1, "b": 2}
                )
            ],
        ),
        ChatMessage(
            role=MessageRole.TOOL, content="3", additional_kwargs={"tool_call_id": "abcDEF123"}
        ),
    ]
    mistral = (TEMPLATES / "mistral.jinja").read_text()
    prompt = "".join(chat_pieces(history, mistral, MISTRAL_VARS))
    assert '"id": "abcDEF123"' in prompt and '"call_id": "abcDEF123"' in prompt
    assert "<tool_call>" not in prompt
    default = "".join(chat_pieces(history))  # the built-in template: Hermes blocks
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' in default
    tools = [FunctionTool.from_defaults(li_add, name="add")]
    response = li_llm.chat_with_tools(tools, chat_history=history)
    assert response.message.role == MessageRole.ASSISTANT
