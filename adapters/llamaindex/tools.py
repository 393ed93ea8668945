"""Function calling for ``Eclectus``: LlamaIndex tools in, ``ToolSelection`` s out.

A chat call's tool kwargs (``tools``, ``tool_choice``, ``parallel_tool_calls``: what
:func:`prepare_chat_with_tools` returns for ``FunctionCallingLLM.chat_with_tools``) are read
the way the OpenAI endpoint reads a request body (eclectus.protocol.openai_tools): the tools
reach the chat template as ``tools=``, a required or named call is enforced by the engine's
grammar (``structured_outputs``), and the reply's calls, in the syntax the server announces
for the model (``ModelCard.tool_call_format``: Hermes ``<tool_call>`` blocks, Llama 3 JSON,
Mistral ``[TOOL_CALLS]``; eclectus.protocol.tool_formats), become ``ToolCallBlock`` s of the
assistant message, with OpenAI's ``tool_calls`` in its ``additional_kwargs`` for code that
reads them there.

Assistant turns with calls reach the chat template as its ``tool_calls`` and tool results
(``MessageRole.TOOL`` messages, ``additional_kwargs["tool_call_id"]``) with their
``tool_call_id``, as ``apply_chat_template`` takes them, so a FunctionAgent's scratchpad
round-trips through the template in the model's own syntax.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    MessageRole,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools.types import BaseTool

from eclectus.adapters.tool_choice import openai_tool_choice
from eclectus.protocol.chat_template import template_tool_call
from eclectus.protocol.openai_tools import ChatConstraint, chat_constraint
from eclectus.protocol.tool_formats import ToolFormatName, tool_format
from eclectus.protocol.tools import ToolCall, ToolChoice

# Chat kwargs that describe tools rather than sampling.
TOOL_KWARGS = ("tools", "tool_choice", "parallel_tool_calls")
NO_CONSTRAINT = ChatConstraint()


def tool_choice_of(tool_choice: Any, tool_required: bool) -> ToolChoice:
    """LlamaIndex's ``tool_choice`` forms in OpenAI's shape (pure): None ("required" when
    ``tool_required``, else "auto"), "auto" / "none" / "required" ("any" too), a tool's
    name, or OpenAI's ``{"type": "function", "function": {"name": ...}}``."""
    if tool_choice is None:
        return "required" if tool_required else "auto"
    return openai_tool_choice(tool_choice)


def prepare_chat_with_tools(
    tools: Sequence[BaseTool],
    user_msg: str | ChatMessage | None,
    chat_history: Sequence[ChatMessage] | None,
    allow_parallel_tool_calls: bool,
    tool_required: bool,
    tool_choice: Any,
    kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``chat`` kwargs of one ``chat_with_tools`` call (pure): the messages, the tools
    as OpenAI tool objects, the choice and whether calls may be parallel."""
    messages = list(chat_history or [])
    if isinstance(user_msg, str):
        user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
    if user_msg is not None:
        messages.append(user_msg)
    chat: dict[str, Any] = {"messages": messages, **kwargs}
    if tools:
        chat["tools"] = [t.metadata.to_openai_tool() for t in tools]
        chat["tool_choice"] = tool_choice_of(tool_choice, tool_required)
        chat["parallel_tool_calls"] = allow_parallel_tool_calls
    return chat


def has_tools(kwargs: Mapping[str, Any]) -> bool:
    """Whether a chat call's kwargs give tools (pure)."""
    return any(kwargs.get(k) is not None for k in TOOL_KWARGS)


def split_tool_kwargs(
    kwargs: Mapping[str, Any], tool_format_name: ToolFormatName = "hermes"
) -> tuple[dict[str, Any], ChatConstraint]:
    """A chat call's kwargs as (sampling and other kwargs, the tools' constraint, for a
    model writing calls in ``tool_format_name``) (pure).
    The constraint's ``structured_outputs`` (the tools' grammar, or a format given beside
    the tools) is put in the sampling kwargs. Read as the OpenAI endpoint reads a body: a
    ``structured_outputs`` beside tools wins over "auto" (the tools are shown, the reply
    is not parsed for calls) and conflicts with a required or named choice. ValueError (a
    ToolRequestError naming the field) for a malformed tool, choice or conflict."""
    rest = {k: v for k, v in kwargs.items() if k not in TOOL_KWARGS}
    body = {k: kwargs[k] for k in TOOL_KWARGS if kwargs.get(k) is not None}
    if not body:
        return rest, NO_CONSTRAINT
    if rest.get("structured_outputs") is not None:
        body["structured_outputs"] = rest.pop("structured_outputs")
    constraint = chat_constraint(body, tool_format_name)
    if constraint.structured_outputs is not None:
        rest["structured_outputs"] = constraint.structured_outputs
    return rest, constraint


# -- messages -------------------------------------------------------------------------------


def calls_of(message: ChatMessage) -> list[ToolCall]:
    """The tool calls an assistant message carries (pure): its ``ToolCallBlock`` s, else
    OpenAI-shaped ``additional_kwargs["tool_calls"]`` (what older LlamaIndex code stores)."""
    blocks = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    if blocks:
        return [ToolCall(b.tool_call_id or "", b.tool_name, _args(b.tool_kwargs)) for b in blocks]
    calls = []
    for entry in message.additional_kwargs.get("tool_calls") or ():
        entry = entry if isinstance(entry, Mapping) else _as_dict(entry)
        function = entry.get("function") or {}
        calls.append(
            ToolCall(entry.get("id") or "", function["name"], _args(function.get("arguments")))
        )
    return calls


def _as_dict(obj: Any) -> dict[str, Any]:
    dump = getattr(obj, "model_dump", None)
    if dump is None:
        raise ValueError(f"a tool call is an OpenAI tool_calls entry, not {obj!r}")
    return dump()


def _args(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, Mapping):
        raise ValueError(f"tool call arguments must be a JSON object, not {arguments!r}")
    return dict(arguments)


def template_fields(message: ChatMessage) -> dict[str, Any]:
    """A message's fields for the chat template beside its role and content (pure): an
    assistant turn's calls as ``tool_calls`` (OpenAI's shape) and a tool result's
    ``tool_call_id`` (``additional_kwargs["tool_call_id"]``), as ``apply_chat_template``
    takes them, so the template writes past calls and results in the model's own syntax."""
    if message.role == MessageRole.ASSISTANT:
        calls = calls_of(message)
        if calls:
            return {"tool_calls": [template_tool_call(c.id, c.name, c.arguments) for c in calls]}
    if message.role == MessageRole.TOOL:
        call_id = message.additional_kwargs.get("tool_call_id")
        if call_id is not None:
            return {"tool_call_id": call_id}
    return {}


def reply_message(content: str, calls: Sequence[ToolCall]) -> ChatMessage:
    """The assistant message of a reply (pure): a text block, then one ToolCallBlock per
    call; OpenAI's ``tool_calls`` in ``additional_kwargs`` as well."""
    blocks: list[Any] = [TextBlock(text=content)]
    blocks += [
        ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=dict(c.arguments))
        for c in calls
    ]
    extra = {"tool_calls": [c.openai() for c in calls]} if calls else {}
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=extra)


def reply_of(text: str, constraint: ChatConstraint) -> ChatMessage:
    """The assistant message of generated ``text``, its calls parsed when tools were given
    (pure)."""
    if not constraint.parse_tool_calls:
        return reply_message(text, [])
    return reply_message(*tool_format(constraint.tool_format).parse(text))


def tool_selections(message: ChatMessage) -> list[ToolSelection]:
    """The message's calls as LlamaIndex ToolSelections (pure)."""
    return [
        ToolSelection(tool_id=c.id, tool_name=c.name, tool_kwargs=c.arguments)
        for c in calls_of(message)
    ]


class ReplyReader:
    """A streamed reply as assistant messages (mutated by :meth:`feed` / :meth:`finish`):
    the content so far, and each call once it is complete. Text that may begin a call is
    held back until it does not."""

    def __init__(self, constraint: ChatConstraint) -> None:
        fmt = tool_format(constraint.tool_format)
        self._stream = fmt.stream() if constraint.parse_tool_calls else None
        self.content = ""
        self.calls: list[ToolCall] = []
        self._num_reported = 0  # calls already shown in a streamed response

    def feed(self, delta: str) -> str:
        """Take ``delta``; return the content it releases (mutates)."""
        if self._stream is None:
            self.content += delta
            return delta
        return self._take(self._stream.feed(delta))

    def finish(self) -> str:
        """Release what is held back (mutates: the stream is drained)."""
        return "" if self._stream is None else self._take(self._stream.finish())

    def _take(self, events: Sequence[Any]) -> str:
        released = ""
        for event in events:
            if event.call is not None:
                self.calls.append(event.call)
            released += event.content
        self.content += released
        return released

    def responses(self, released: str) -> list[ChatResponse]:
        """The streamed response for content just ``released``: none when nothing new was
        released (text held back while it may begin a call), else the reply so far
        (mutates: counts the calls shown)."""
        if not released and len(self.calls) == self._num_reported:
            return []
        self._num_reported = len(self.calls)
        return [ChatResponse(message=self.message(), delta=released)]

    def message(self) -> ChatMessage:
        """The reply so far (pure); content stripped once calls are present, as
        :meth:`~eclectus.protocol.tool_formats.ToolFormat.parse` strips it."""
        content = self.content.strip() if self.calls else self.content
        return reply_message(content, self.calls)


def chat_response(completion: CompletionResponse, constraint: ChatConstraint) -> ChatResponse:
    """A finished chat call's response, its tool calls parsed (pure). The call's token
    counts are in the message's ``additional_kwargs`` (where a plain chat reply kept them
    before tools) and the response's."""
    message = reply_of(completion.text, constraint)
    message.additional_kwargs = {**completion.additional_kwargs, **message.additional_kwargs}
    return ChatResponse(
        message=message, raw=completion.raw, additional_kwargs=completion.additional_kwargs
    )


def chat_stream(completions: Iterator[CompletionResponse], reader: ReplyReader) -> ChatResponseGen:
    """Streamed text as chat responses: the content so far and each call once complete
    (mutates ``reader``)."""
    for completion in completions:
        yield from reader.responses(reader.feed(completion.delta or ""))
    yield from reader.responses(reader.finish())


async def achat_stream(
    completions: AsyncIterator[CompletionResponse], reader: ReplyReader
) -> ChatResponseAsyncGen:
    """Async twin of :func:`chat_stream`."""
    async for completion in completions:
        for response in reader.responses(reader.feed(completion.delta or "")):
            yield response
    for response in reader.responses(reader.finish()):
        yield response
