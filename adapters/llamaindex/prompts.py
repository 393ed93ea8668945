"""Prompt capture: a LlamaIndex prompt template rendered as segments instead of one string.

LlamaIndex formats a template into a single string before the model sees it, which hides
where the constant text ends and a variable's value begins. :func:`template_pieces` renders
the template exactly as ``LLM.predict`` would (selector, partials, output parser, system
prompt, query wrapper, ``completion_to_prompt``), but with a unique sentinel in place of
every variable, then splits on the sentinels. The result is the constant text and the
variable slots in order, so the server sees the template's structure (its seams are where
a shared prefix is pinned; the server tokenizes the flat text, as a stock server does).

Rendering must be byte-identical to the stock string: :func:`check_pieces` verifies it for
string values, and callers fall back to one text piece when a template does something the
sentinels cannot survive (a function mapping that inspects its inputs, say).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.llms.llm import LLM
from llama_index.core.prompts import (
    BasePromptTemplate,
    ChatPromptTemplate,
    RichPromptTemplate,
    SelectorPromptTemplate,
)

from eclectus.adapters.llamaindex.tools import template_fields
from eclectus.protocol import ModelCard
from eclectus.protocol.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat_pieces


@dataclass(frozen=True, slots=True)
class Slot:
    """The place of template variable ``name`` in a rendered prompt."""

    name: str


Piece = str | Slot


def _sentinels(names: Sequence[str]) -> dict[str, str]:
    """One sentinel per variable name. A fresh uuid keeps them out of any real text; the
    private-use delimiters are not whitespace, so templates that strip a value (a chat
    RichPromptTemplate, a Jinja chat template's ``| trim``) leave the sentinel whole."""
    tag = uuid.uuid4().hex[:12]
    return {name: f"\ue000{tag}:{i}\ue001" for i, name in enumerate(names)}


def template_pieces(
    render: Callable[..., str],
    prompt: BasePromptTemplate,
    prompt_args: Mapping[str, Any],
) -> list[Piece]:
    """Render ``prompt`` with ``render`` (the LLM's ``_get_prompt``) and split it into
    constant text and :class:`Slot` s for every variable given in ``prompt_args`` or in the
    template's partial kwargs. Pure: neither argument is modified.

    Empty text between two adjacent slots is dropped (it tokenizes to nothing).
    """
    partial_names = [name for name in prompt.kwargs if name not in prompt_args]
    names = [*partial_names, *prompt_args]
    sentinels = _sentinels(names)
    if partial_names:
        # partial_format copies the template, so the caller's prompt keeps its values
        prompt = prompt.partial_format(**{name: sentinels[name] for name in partial_names})
    rendered = render(prompt, **{name: sentinels[name] for name in prompt_args})
    sentinel_to_name = {s: name for name, s in sentinels.items()}
    pattern = re.compile("(" + "|".join(re.escape(s) for s in sentinels.values()) + ")")
    pieces: list[Piece] = []
    for part in pattern.split(rendered) if sentinels else [rendered]:
        if part in sentinel_to_name:
            pieces.append(Slot(sentinel_to_name[part]))
        elif part:
            pieces.append(part)
    return pieces


def is_chat_prompt(prompt: BasePromptTemplate, llm: LLM) -> bool:
    """Whether LlamaIndex formats ``prompt`` through the LLM's ``messages_to_prompt`` (a
    chat prompt template, or a rich one of chat blocks), once a selector has picked its
    template for ``llm`` (pure)."""
    if isinstance(prompt, SelectorPromptTemplate):
        prompt = prompt.select(llm=llm)
    if isinstance(prompt, RichPromptTemplate):
        return prompt.is_chat_template
    return isinstance(prompt, ChatPromptTemplate)


def template_values(prompt: BasePromptTemplate, prompt_args: Mapping[str, Any]) -> dict[str, Any]:
    """The value of every variable :func:`template_pieces` makes a slot for (pure)."""
    values: dict[str, Any] = {k: v for k, v in prompt.kwargs.items() if k not in prompt_args}
    values.update(prompt_args)
    return values


def join_pieces(pieces: Sequence[Piece], values: Mapping[str, Any]) -> str:
    """The prompt string the pieces stand for, with every slot's value as ``str`` (pure)."""
    return "".join(p if isinstance(p, str) else str(values[p.name]) for p in pieces)


def check_pieces(pieces: Sequence[Piece], values: Mapping[str, Any], expected: str) -> bool:
    """Whether the pieces, filled with ``values``, give exactly the stock ``expected``
    string. A template whose function mappings or parser transform a value fails this."""
    return join_pieces(pieces, values) == expected


# -- chat -----------------------------------------------------------------------------------

ASSISTANT_HEADER = "<|assistant|>\n"


def message_text(message: ChatMessage) -> str:
    """A message's text content ("" when it has none); its calls and call id reach the
    template apart (:func:`.tools.template_fields`)."""
    return message.content or ""


def chat_pieces(
    messages: Sequence[ChatMessage],
    template: str | None = None,
    template_vars: Mapping[str, str] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[str]:
    """Messages as text pieces in the model's chat template (pure).

    With the built-in model's template (``template`` None or DEFAULT_CHAT_TEMPLATE) and no
    tools or calls: one piece per message, ``<|role|>\ncontent\n`` for each, then
    ``<|assistant|>\n`` to open the reply. Otherwise (the Jinja template the server
    announces): the template's text between messages as pieces and each message's content
    as its own piece (eclectus.protocol.chat_template.render_chat_pieces; a message whose
    content the template transforms is merged into the text around it). The server tokenizes
    the flat render, so a conversation that grows by a turn reuses the KV of the full blocks
    of all earlier turns (the prefix cache matches equal ids). ``tools`` (OpenAI tool
    objects) reach the template as its ``tools`` variable (the built-in template then opens
    with a system turn listing them); an assistant turn's calls and a tool result's call id
    as its messages' ``tool_calls`` and ``tool_call_id``."""
    fields = [template_fields(m) for m in messages]
    default = template is None or template == DEFAULT_CHAT_TEMPLATE
    if default and not tools and not any(fields):
        pieces = [f"<|{m.role.value}|>\n{message_text(m)}\n" for m in messages]
        pieces.append(ASSISTANT_HEADER)
        return pieces
    rendered = render_chat_pieces(
        template,
        [(m.role.value, [message_text(m)], f) for m, f in zip(messages, fields, strict=True)],
        text_of=str,
        template_vars=template_vars,
        tools=tools or None,
    )
    return [p for p in rendered if p]


def messages_to_prompt(
    messages: Sequence[ChatMessage],
    template: str | None = None,
    template_vars: Mapping[str, str] | None = None,
) -> str:
    """``messages`` in ``template`` as one string (pure). Called with the messages only it
    renders the built-in template; an ``Eclectus`` LLM's hook is a
    :class:`ServedChatTemplate` instead, which knows the served model's template."""
    return "".join(chat_pieces(messages, template, template_vars))


class ServedChatTemplate:
    """LlamaIndex's ``messages_to_prompt`` hook bound to a served model: renders messages in
    the chat template the server announces for it (``ModelCard.chat_template`` and
    ``template_vars``), exactly as the server's tokenizer renders them.

    LlamaIndex calls the hook with the messages only (``LLM._get_prompt`` hands it to a chat
    prompt template's ``format``), so the template cannot be an argument: ``model_info``
    fetches it when called (it may connect), which also keeps it right after a reconnect."""

    def __init__(self, model_info: Callable[[], ModelCard]) -> None:
        self._model_info = model_info

    def pieces(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[str]:
        """The messages (and ``tools``) as text pieces, as :func:`chat_pieces` cuts them
        (may connect)."""
        info = self._model_info()
        return chat_pieces(messages, info.chat_template, info.template_vars, tools)

    def __call__(self, messages: Sequence[ChatMessage]) -> str:
        """The messages as one prompt string (may connect)."""
        return "".join(self.pieces(messages))
