"""Symbolic values: what flows between runnables while a chain is lowered.

A symbolic value is a concrete Python value (``str``, a message, anything), a
:class:`~eclectus.adapters.langchain.pieces.Ref` (text a server variable will hold), a
:class:`~eclectus.adapters.langchain.pieces.SymMessage` (an ``AIMessage`` whose text is a
ref), a :class:`SymPrompt` (a prompt value whose text is pieces), or a dict / list / tuple of
those. :func:`collect_refs` and :func:`rebuild` turn one into its concrete twin once the
refs' texts are known: exactly what the eager chain would have had at that point.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.prompt_values import ChatPromptValue, StringPromptValue
from pydantic import BaseModel

from eclectus.adapters.langchain.pieces import Piece, Ref, Spread, Symbolic, SymMessage, Value
from eclectus.adapters.langchain.prompts import PromptMessage


class Derived(Symbolic):
    """A symbolic value the Python evaluator (adapters/pyeval) builds out of refs: a
    string of pieces, a message around one. It says which refs it needs and what it is
    once they are known, so :func:`collect_refs` and :func:`rebuild` handle it anywhere."""

    __slots__ = ()

    def refs(self) -> list[Ref]:
        """The refs its value needs, in order (pure)."""
        raise NotImplementedError

    def concrete(self, texts: Mapping[int, str]) -> Any:
        """Its concrete value; ``texts`` maps ``id(ref)`` to the ref's text (pure)."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True, eq=False)
class SymPrompt(Symbolic):
    """A prompt value to be: a string prompt (``text``) or chat messages (``messages``)."""

    text: list[Piece] | None = None
    messages: list[PromptMessage] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class SymParsed(Symbolic):
    """A JSON output parser's result over a constrained reply (``with_structured_output``):
    the reply is valid JSON by construction; ``schema`` is its constraint's JSON Schema
    (None: any JSON object); ``parser`` turns the reply into the eager value. ``path``:
    object keys into that value (one field of the parsed dict or model, as a node's output
    is split into state keys); empty for the whole value."""

    message: SymMessage | Ref  # a chat model's reply, or a completion model's text
    parser: Any
    schema: dict[str, Any] | None
    path: tuple[str, ...] = ()

    @property
    def ref(self) -> Ref:
        return self.message.ref if isinstance(self.message, SymMessage) else self.message


def collect_refs(value: Any, out: list[Ref]) -> list[Ref]:
    """Appends every ref inside ``value`` to ``out`` (in order, repeats kept); returns it."""
    if isinstance(value, Ref):
        out.append(value)
    elif isinstance(value, SymMessage | Spread | SymParsed):
        out.append(value.ref)
    elif isinstance(value, Derived):
        out.extend(value.refs())
    elif isinstance(value, SymPrompt):
        for piece in value.text or []:
            collect_refs(piece, out)
        for _, _, pieces in value.messages or []:
            for piece in pieces:
                collect_refs(piece, out)
    elif isinstance(value, Mapping):
        for item in value.values():
            collect_refs(item, out)
    elif isinstance(value, list | tuple):
        for item in value:
            collect_refs(item, out)
    return out


def rebuild(value: Any, texts: Mapping[int, str]) -> Any:
    """The concrete twin of ``value``; ``texts`` maps ``id(ref)`` to its text. Pure."""
    if isinstance(value, Ref):
        return texts[id(value)]
    if isinstance(value, SymMessage):
        return ai_message(value, texts[id(value.ref)])
    if isinstance(value, SymPrompt):
        return _prompt_value(value, texts)
    if isinstance(value, Derived):
        return value.concrete(texts)
    if isinstance(value, SymParsed):
        text = texts[id(value.ref)]
        if isinstance(value.message, SymMessage):
            parsed = value.parser.invoke(ai_message(value.message, text))
        else:
            parsed = value.parser.invoke(text)
        for key in value.path:  # a field of a dict (or model) output, as the state holds it
            parsed = getattr(parsed, key) if isinstance(parsed, BaseModel) else parsed[key]
        return parsed
    if isinstance(value, dict):
        return {key: rebuild(item, texts) for key, item in value.items()}
    if isinstance(value, list):
        return [part for item in value for part in _spliced(item, texts)]
    if isinstance(value, tuple):
        return tuple(rebuild(item, texts) for item in value)
    return value


def _spliced(item: Any, texts: Mapping[int, str]) -> list[Any]:
    """A list item's concrete items: a Spread's whole array, else the one item (pure)."""
    if isinstance(item, Spread):
        return list(json.loads(texts[id(item.ref)]))
    return [rebuild(item, texts)]


def pieces_text(pieces: list[Piece], texts: Mapping[int, str]) -> str:
    """The text of pieces once their refs are known (pure)."""
    parts = []
    for piece in pieces:
        if isinstance(piece, Ref):
            parts.append(texts[id(piece)])
        else:
            parts.append(piece.text if isinstance(piece, Value) else piece)
    return "".join(parts)


def ai_message(message: SymMessage, text: str) -> AIMessage:
    """The AIMessage a chat model call produced, with usage and metadata like the eager
    model's (pure apart from reading the variable's usage)."""
    var = message.ref.var
    usage = var.usage
    metadata: dict[str, Any] = {
        "model_name": message.model_name,
        "model_provider": "eclectus",
        "finish_reason": var.finish_reason,
    }
    if usage is None:
        return AIMessage(content=text, response_metadata=metadata)
    usage_metadata = UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        input_token_details=InputTokenDetails(cache_read=usage.cached_tokens),
    )
    return AIMessage(content=text, usage_metadata=usage_metadata, response_metadata=metadata)


def _prompt_value(prompt: SymPrompt, texts: Mapping[int, str]) -> Any:
    if prompt.text is not None:
        return StringPromptValue(text=pieces_text(prompt.text, texts))
    messages: list[BaseMessage] = []
    for cls, role, pieces in prompt.messages or []:
        content = pieces_text(pieces, texts)
        if cls is ChatMessage:
            messages.append(ChatMessage(role=role, content=content))
        else:
            messages.append(cls(content=content))
    return ChatPromptValue(messages=messages)
