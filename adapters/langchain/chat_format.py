"""Chat messages to one prompt, with the documented default chat template.

The client renders chat messages itself, with the template the embedded ``tiny`` model
carries::

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n

one ``<|role|>\\n{content}\\n`` block per message, then ``<|assistant|>\\n`` to open the
reply. Rendering on the client keeps template boundaries visible as segments (the constant
role markers and template text are shared prefixes; variable values are their own segments),
which a server-side ``apply_chat_template`` over flat strings would hide. A server model
with a different chat template gets this one all the same (docs/langchain.md says so).
"""

from __future__ import annotations

from collections.abc import Sequence

from eclectus.adapters.langchain.pieces import Piece, Value, normalize
from langchain_core.messages import BaseMessage, ChatMessage, get_buffer_string

DEFAULT_CHAT_TEMPLATE = "<|{role}|>\n{content}\n"
DEFAULT_GENERATION_PROMPT = "<|assistant|>\n"

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


def message_text(message: BaseMessage) -> str:
    """A message's text: string content, or its text blocks joined; raises ValueError for
    non-text content (images, audio), which this adapter does not send."""
    if isinstance(message.content, str):
        return message.content
    for block in message.content:
        if not (isinstance(block, str) or block.get("type") == "text"):
            raise ValueError(f"content block of type {block.get('type')!r} is not supported")
    return message.text


def render_chat(messages: Sequence[tuple[str, Sequence[Piece]]]) -> list[Piece]:
    """Render ``(role, pieces)`` messages into one prompt, ending with the generation prompt.

    Each message's pieces stay pieces, so variable boundaries survive rendering.
    """
    head, tail = DEFAULT_CHAT_TEMPLATE.split("{content}")
    out: list[Piece] = []
    for role, pieces in messages:
        out.append(head.format(role=role))
        out.extend(pieces)
        out.append(tail)
    out.append(DEFAULT_GENERATION_PROMPT)
    return normalize(out)


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


def render_messages(messages: Sequence[BaseMessage]) -> list[Piece]:
    """Render concrete LangChain messages (each message's text one value piece)."""
    return render_chat([(message_role(m), [Value(message_text(m))]) for m in messages])
