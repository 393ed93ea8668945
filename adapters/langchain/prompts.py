"""Prompt templates to prompt pieces, for the tracing hook and for the compiler alike.

Both paths use these functions, so an eager run (tracing hook) and a compiled run cut a
prompt at the same places. Inputs may be concrete (any Python value) or symbolic (a
:class:`Ref`, or a list holding refs). A value is rendered the way the template format
renders it: ``format(value, "")`` for f-strings, ``str`` for jinja2, the mustache renderer for
mustache. What cannot be rendered exactly with symbolic inputs raises :class:`NotLowerable`;
with concrete inputs everything falls back to LangChain's own formatting.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.prompts.chat import ChatMessagePromptTemplate
from langchain_core.utils import mustache

from eclectus.adapters.langchain.chat_format import message_role, message_text
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.langchain.pieces import (
    Piece,
    Ref,
    Spread,
    SymMessage,
    Value,
    contains_symbolic,
    normalize,
)

# Renders a list that holds refs exactly as ``str(list)`` would (the server's repr_list op).
ListRenderer = Callable[[list[Any]], Piece]
# One message of a chat prompt: (LangChain message class, chat role, content pieces).
PromptMessage = tuple[type[BaseMessage], str, list[Piece]]


def value_piece(value: Any, render_list: ListRenderer | None) -> Piece:
    """The piece ``format(value, "")`` would produce (``str`` for every type we accept)."""
    if isinstance(value, Ref):
        return value
    if not contains_symbolic(value):
        return Value(format(value, ""))
    listed = isinstance(value, list) and all(isinstance(x, str | Ref | Spread) for x in value)
    if listed and render_list is not None:
        return render_list(value)
    raise NotLowerable(f"cannot render {type(value).__name__} holding server values as text")


def merged_inputs(
    prompt: PromptTemplate | ChatPromptTemplate, inputs: Mapping[str, Any]
) -> dict[str, Any]:
    """Partial variables (called when callable) overlaid by the user's inputs."""
    partials = {k: v() if callable(v) else v for k, v in prompt.partial_variables.items()}
    return {**partials, **inputs}


def string_prompt_pieces(
    prompt: PromptTemplate, inputs: Mapping[str, Any], render_list: ListRenderer | None = None
) -> list[Piece]:
    """The pieces of a PromptTemplate's text for ``inputs`` (does not mutate anything)."""
    values = merged_inputs(prompt, inputs)
    try:
        if prompt.template_format == "f-string":
            return normalize(_fstring_pieces(prompt.template, values, render_list))
        if prompt.template_format == "mustache":
            return normalize(_mustache_pieces(prompt.template, values, render_list))
        return normalize(_jinja2_pieces(prompt.template, values, render_list))
    except NotLowerable:
        if contains_symbolic(values):
            raise
        return [prompt.format(**inputs)]


def _fstring_pieces(
    template: str, values: dict[str, Any], render_list: ListRenderer | None
) -> list[Piece]:
    pieces: list[Piece] = []
    for literal, field, spec, conversion in string.Formatter().parse(template):
        pieces.append(literal)
        if field is None:
            continue
        if field.isidentifier() and not spec and not conversion:
            pieces.append(value_piece(values[field], render_list))
            continue
        # Attribute access, indexing, a conversion or a format spec: exact only client-side.
        if contains_symbolic(values):
            raise NotLowerable(f"f-string field {{{field}}} needs client-side formatting")
        text = "{" + field + (f"!{conversion}" if conversion else "") + f":{spec or ''}" + "}"
        pieces.append(Value(text.format(**values)))
    return pieces


def _mustache_pieces(
    template: str, values: dict[str, Any], render_list: ListRenderer | None
) -> list[Piece]:
    pieces: list[Piece] = []
    for tag, key in mustache.tokenize(template):
        if tag == "literal":
            pieces.append(key)
        elif tag not in ("variable", "no escape") or "." in key:
            raise NotLowerable(f"mustache {tag} tag {key!r} needs client-side rendering")
        elif not contains_symbolic(values.get(key)):
            pieces.append(Value(mustache.render([(tag, key)], values)))
        elif tag == "no escape":
            pieces.append(value_piece(values[key], render_list))
        else:
            # {{x}} HTML-escapes its value; the server has no such operator.
            raise NotLowerable(f"mustache {{{{{key}}}}} escapes a server value (use {{{{{{x}}}}}})")
    return pieces


def _jinja2_pieces(
    template: str, values: dict[str, Any], render_list: ListRenderer | None
) -> list[Piece]:
    from jinja2 import nodes
    from jinja2.sandbox import SandboxedEnvironment

    tree = SandboxedEnvironment().parse(template)
    pieces: list[Piece] = []
    for node in tree.body:
        if not isinstance(node, nodes.Output):
            raise NotLowerable(f"jinja2 {type(node).__name__} needs client-side rendering")
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                pieces.append(child.data)
            elif isinstance(child, nodes.Name) and not contains_symbolic(values.get(child.name)):
                pieces.append(Value(str(values[child.name])))
            elif isinstance(child, nodes.Name):
                pieces.append(value_piece(values[child.name], render_list))
            else:
                raise NotLowerable("a jinja2 expression needs client-side rendering")
    return pieces


def chat_prompt_messages(
    prompt: ChatPromptTemplate,
    inputs: Mapping[str, Any],
    render_list: ListRenderer | None = None,
) -> list[PromptMessage]:
    """The messages of a ChatPromptTemplate for ``inputs``, each as content pieces."""
    values = merged_inputs(prompt, inputs)
    out: list[PromptMessage] = []
    for item in prompt.messages:
        if isinstance(item, BaseMessage):
            out.append((type(item), message_role(item), [message_text(item)]))
        elif isinstance(item, MessagesPlaceholder):
            out.extend(_placeholder_messages(item, values))
        elif isinstance(getattr(item, "prompt", None), PromptTemplate):
            cls = _message_class(item)
            role = item.role if isinstance(item, ChatMessagePromptTemplate) else None
            role = role or message_role(cls(content=""))
            pieces = string_prompt_pieces(item.prompt, values, render_list)
            out.append((cls, role, pieces))
        elif contains_symbolic(values):
            raise NotLowerable(f"{type(item).__name__} needs client-side formatting")
        else:
            for message in item.format_messages(**values):
                out.append((type(message), message_role(message), [message_text(message)]))
    return out


def _message_class(item: Any) -> type[BaseMessage]:
    """The message class a message template produces (a pydantic private attribute)."""
    private = getattr(type(item), "__private_attributes__", {}).get("_msg_class")
    if private is None:  # ChatMessagePromptTemplate has no class attribute
        from langchain_core.messages import ChatMessage

        return ChatMessage
    return private.default


def _placeholder_messages(item: MessagesPlaceholder, values: dict[str, Any]) -> list[PromptMessage]:
    value = values.get(item.variable_name, [] if item.optional else None)
    if value is None:
        raise KeyError(item.variable_name)
    if not isinstance(value, list):
        raise NotLowerable(f"placeholder {item.variable_name!r} is not a list of messages")
    if item.n_messages:
        value = value[-item.n_messages :]
    out: list[PromptMessage] = []
    for element in value:
        if isinstance(element, SymMessage):
            out.append((AIMessage, "assistant", [element.ref]))
        elif contains_symbolic(element):
            raise NotLowerable(f"placeholder {item.variable_name!r} holds server values")
        else:
            (message,) = convert_to_messages([element])
            if isinstance(message, ToolMessage) or getattr(message, "tool_calls", None):
                # the eager model writes tool calls and results with fields a prompt
                # message here does not carry: the call runs on the client, exactly
                raise NotLowerable("a tool call or tool result among the messages")
            out.append((type(message), message_role(message), [Value(message_text(message))]))
    return out
