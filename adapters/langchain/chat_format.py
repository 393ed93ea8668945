"""Chat messages to one prompt, in the served model's own chat template.

The client renders chat messages itself, with the Jinja chat template the server announces
for the model in its welcome (``ModelCard.chat_template`` and ``template_vars``), or, when
it announces none, the default template of the embedded ``tiny`` model::

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n

Rendering on the client keeps template boundaries visible as segments (the constant role
markers and template text are shared prefixes; variable values are their own segments),
which a server-side ``apply_chat_template`` over flat strings would hide. The call is sent as
a chat prompt (``add_special_tokens`` false): the server tokenizes the flat render and adds
no special token beyond the template's, as vLLM's chat endpoint. The splice rule
(and when a message falls back to plain text) is eclectus.protocol.chat_template's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    ToolMessage,
    get_buffer_string,
)

from eclectus.adapters.langchain.pieces import Piece, Ref, Value, normalize
from eclectus.protocol import ModelCard
from eclectus.protocol.chat_template import PiecesMessage, render_chat_pieces, template_tool_call
from eclectus.protocol.tool_formats import ToolFormatName


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A model's chat template as the server announced it (``source`` None: the default),
    and the syntax its model writes tool calls in (``ModelCard.tool_call_format``)."""

    source: str | None = None
    template_vars: Mapping[str, str] = field(default_factory=dict)
    tool_format: ToolFormatName = "hermes"

    @classmethod
    def of(cls, info: ModelCard | None) -> ChatTemplate:
        """The template of a welcome's model entry (None: the default template)."""
        if info is None:
            return cls()
        return cls(info.chat_template, dict(info.template_vars), info.tool_call_format)


DEFAULT_TEMPLATE = ChatTemplate()

# LangChain message type -> chat-template role.
_TYPE_TO_ROLE = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}


def message_role(message: BaseMessage) -> str:
    """The chat-template role of a LangChain message (a ChatMessage keeps its own role)."""
    if isinstance(message, ChatMessage):
        return message.role
    return _TYPE_TO_ROLE.get(message.type, message.type)


# Content blocks that restate an assistant's tool calls (Anthropic's "tool_use", LangChain's
# standard "tool_call"): the calls are rendered from ``AIMessage.tool_calls``.
_CALL_BLOCKS = frozenset({"tool_use", "tool_call"})


def message_text(message: BaseMessage) -> str:
    """A message's text: string content, or its text blocks joined; raises ValueError for
    non-text content (images, audio), which this adapter does not send."""
    if isinstance(message.content, str):
        return message.content
    for block in message.content:
        if isinstance(block, dict) and block.get("type") in _CALL_BLOCKS:
            continue  # a call is rendered from message.tool_calls, not from its block
        if not (isinstance(block, str) or block.get("type") == "text"):
            raise ValueError(f"content block of type {block.get('type')!r} is not supported")
    return message.text


def message_fields(message: BaseMessage) -> dict[str, Any]:
    """A message's fields for the chat template beside its role and content (pure): an
    AIMessage's ``tool_calls`` (OpenAI's shape) and a ToolMessage's ``tool_call_id``, as
    ``apply_chat_template`` takes them, so the template writes past calls and results in
    the served model's own syntax."""
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [
            template_tool_call(c.get("id") or "", c["name"], c["args"]) for c in message.tool_calls
        ]
        return {"tool_calls": calls}
    if isinstance(message, ToolMessage):
        return {"tool_call_id": message.tool_call_id}
    return {}


def _text_of(piece: Value | Ref) -> str | None:
    return piece.text if isinstance(piece, Value) else None


def render_chat(
    messages: Sequence[PiecesMessage[Piece]],
    template: ChatTemplate = DEFAULT_TEMPLATE,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[Piece]:
    """Render ``(role, pieces)`` (or ``(role, pieces, fields)``, see :func:`message_fields`)
    messages into one prompt with ``template``, ending with the generation prompt.

    Each message's pieces stay pieces, so variable boundaries survive rendering, except
    where the template transforms a message's content (then that message is plain text).
    Raises ``ChatTemplateError`` (a ValueError) when such a message holds a :class:`Ref`.
    ``tools`` (OpenAI tool objects) reach the template as its ``tools`` variable.
    """
    return normalize(
        render_chat_pieces(
            template.source,
            messages,
            text_of=_text_of,
            template_vars=template.template_vars,
            tools=tools,
        )
    )


def render_buffer(
    messages: Sequence[tuple[type[BaseMessage], str, Sequence[Piece]]],
) -> list[Piece]:
    """What a completion model gets for chat messages: LangChain's ``get_buffer_string``
    (``Human: ...`` lines), with each message's pieces kept. The role prefix is taken from
    LangChain itself (the buffer string of an empty message), so it stays exact."""
    out: list[Piece] = []
    for index, (cls, role, pieces) in enumerate(messages):
        empty = ChatMessage(role=role, content="") if cls is ChatMessage else cls(content="")
        out.extend(["\n" if index else "", get_buffer_string([empty]), *pieces])
    return normalize(out)


def render_messages(
    messages: Sequence[BaseMessage], template: ChatTemplate = DEFAULT_TEMPLATE
) -> list[Piece]:
    """Render concrete LangChain messages (each message's text one value piece)."""
    rendered = [(message_role(m), [Value(message_text(m))], message_fields(m)) for m in messages]
    return render_chat(rendered, template)
