"""Lowerings of the leaves: prompt templates, Eclectus models, StrOutputParser.

A prompt template becomes a :class:`SymPrompt` (pieces, see prompts.py); a model turns a
prompt into one declared call whose output is a ref (a :class:`SymMessage` for a chat model);
the parser takes the message's text. Prompts are built exactly as the eager models build
them (chat_format.render_chat in the served model's template, the same tracing-hook lookup
for concrete text), so compiled and eager runs send the same segments.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain_core.messages import (
    BaseMessage,
    convert_to_messages,
)
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate

from eclectus.adapters.connection import ws_url
from eclectus.adapters.langchain._client import model_info, model_name_of
from eclectus.adapters.langchain.chat_format import (
    ChatTemplate,
    message_fields,
    message_role,
    render_buffer,
    render_chat,
)
from eclectus.adapters.langchain.chat_models import ChatEclectus
from eclectus.adapters.langchain.compiler.callbacks import CallRecord
from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import register
from eclectus.adapters.langchain.compiler.symbols import SymPrompt
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.langchain.llms import EclectusLLM
from eclectus.adapters.langchain.pieces import (
    Piece,
    Ref,
    SymMessage,
    Value,
    contains_symbolic,
)
from eclectus.adapters.langchain.prompts import chat_prompt_messages, string_prompt_pieces
from eclectus.adapters.langchain.tools import TOOL_KWARGS, split_call_kwargs
from eclectus.adapters.langchain.tracing import TRACER, config_run_id
from eclectus.adapters.sampling import explicit
from eclectus.protocol import StructuredOutputs
from eclectus.protocol.chat_template import ChatTemplateError, PiecesMessage

MODEL_TYPES = (ChatEclectus, EclectusLLM)


def _template_inputs(prompt: PromptTemplate | ChatPromptTemplate, value: Any) -> dict[str, Any]:
    """The input dict as LangChain's prompt validation would build it (a lone non-dict value
    fills the only variable); missing variables are left to the eager prompt's error."""
    if not isinstance(value, dict):
        if len(prompt.input_variables) != 1:
            raise NotLowerable("a prompt with several variables needs a dict input")
        value = {prompt.input_variables[0]: value}
    missing = set(prompt.input_variables) - set(value)
    if missing:
        raise NotLowerable(f"missing prompt inputs {sorted(missing)}")
    return value


@register(PromptTemplate)
async def lower_prompt(prompt: PromptTemplate, value: Any, ctx: Lowering) -> SymPrompt:
    pieces = string_prompt_pieces(prompt, _template_inputs(prompt, value), ctx.repr_list)
    ctx.trace.node(f"prompt ({prompt.template_format}) -> {len(pieces)} segment(s)")
    return SymPrompt(text=pieces)


@register(ChatPromptTemplate)
async def lower_chat_prompt(prompt: ChatPromptTemplate, value: Any, ctx: Lowering) -> SymPrompt:
    messages = chat_prompt_messages(prompt, _template_inputs(prompt, value), ctx.repr_list)
    ctx.trace.node(f"chat prompt -> {len(messages)} message(s)")
    return SymPrompt(messages=messages)


@register(StrOutputParser)
async def lower_str_parser(parser: StrOutputParser, value: Any, ctx: Lowering) -> Any:
    if isinstance(value, SymMessage):
        return value.ref
    if isinstance(value, Ref | str):
        return value
    if isinstance(value, BaseMessage) and not contains_symbolic(value):
        return value.text
    raise NotLowerable(f"StrOutputParser over {type(value).__name__}")


def chat_messages(value: Any, run_id: UUID | None) -> list[PiecesMessage[Piece]]:
    """``(role, pieces)`` of what a chat model receives for ``value`` (LangChain's
    ``_convert_input`` rules: a string is one human message); concrete text keeps the
    template boundaries the tracing hook saw in ``run_id``'s run tree, as the eager model's
    would."""
    if isinstance(value, SymPrompt):
        if value.text is not None:
            return [("user", value.text)]
        return [(role, pieces) for _, role, pieces in value.messages or []]
    if isinstance(value, Ref):
        return [("user", [value])]
    if isinstance(value, str):
        return [("user", TRACER.pieces_for(value, run_id) or [Value(value)])]
    if isinstance(value, PromptValue):
        return _concrete_messages(value.to_messages(), run_id)
    if isinstance(value, list) and not contains_symbolic(value):
        return _concrete_messages(convert_to_messages(value), run_id)
    raise NotLowerable(f"a chat model over {type(value).__name__}")


def _concrete_messages(
    messages: list[BaseMessage], run_id: UUID | None
) -> list[PiecesMessage[Piece]]:
    if any(getattr(m, "tool_calls", None) for m in messages):
        # a turn with tool calls keeps its call on the client (the tool agent's loop); were
        # it lowered, message_fields below renders its calls as the eager model does
        raise NotLowerable("an assistant turn with tool calls among the messages")
    try:
        per_message = TRACER.message_pieces(messages, run_id)
    except ValueError as exc:  # non-text content: the eager model raises the same
        raise NotLowerable(str(exc)) from exc
    fields = [message_fields(m) for m in messages]  # past calls, call ids: as ChatEclectus
    return [(message_role(m), p, f) for m, p, f in zip(messages, per_message, fields, strict=True)]


def llm_prompt(value: Any, run_id: UUID | None) -> list[Piece]:
    """The prompt pieces a completion model receives for ``value`` (``to_string`` rules:
    chat messages become ``Role: content`` lines; template boundaries as in
    :func:`chat_messages`)."""
    if isinstance(value, SymPrompt) and value.text is not None:
        return value.text
    if isinstance(value, SymPrompt):
        return render_buffer(value.messages or [])
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, str):
        return TRACER.pieces_for(value, run_id) or [value]
    if isinstance(value, PromptValue):
        text = value.to_string()
        return TRACER.pieces_for(text, run_id) or [text]
    raise NotLowerable(f"a completion model over {type(value).__name__}")


async def lower_model(model: Any, value: Any, ctx: Lowering, kwargs: dict[str, Any]) -> Any:
    """One declared call of ``model`` (with ``.bind`` kwargs) on ``value``."""
    if (ws_url(model.eclectus_url), model.token) != ctx.server:
        raise NotLowerable("the model talks to another server")
    rest, constraint = _output_format(model, kwargs)
    sampling, name = model.sampling(None, rest), model.model_for(rest)
    if constraint is not None:
        sampling = sampling.model_copy(update={"structured_outputs": constraint})
    if isinstance(model, ChatEclectus):
        template = ChatTemplate.of(model_info(ctx.session.models, name))
        try:
            pieces = render_chat(chat_messages(value, config_run_id(ctx.config)), template)
        except ChatTemplateError as exc:  # the template rewrites content only the server has
            raise NotLowerable(str(exc)) from exc
    else:
        pieces = llm_prompt(value, config_run_id(ctx.config))
    label = f"{model.get_name()} {explicit(sampling)}"
    ref = ctx.declare_call(pieces, sampling, name, label, not model.renders_chat)
    output = (
        ref if isinstance(model, EclectusLLM) else SymMessage(ref, model_name_of(ctx.session, name))
    )
    ctx.calls.append(CallRecord(model, value, output, kwargs))
    return output


def _output_format(
    model: Any, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], StructuredOutputs | None]:
    """A call's sampling kwargs and its output constraint (pure). A chat model's output
    format (``with_structured_output``'s ``response_format``, vLLM's ``extra_body``
    formats) lowers: the reply is the constrained text, as eagerly. Tools do not (their
    reply is parsed into tool calls on the client): NotLowerable."""
    formats = (*TOOL_KWARGS, "extra_body")
    if not any(kwargs.get(k) is not None for k in formats) and not getattr(
        model, "extra_body", None
    ):
        return kwargs, None
    if not isinstance(model, ChatEclectus):
        raise NotLowerable("a completion model bound with an output format")
    rest, constraint = split_call_kwargs(kwargs, model.extra_body)
    if constraint.tools or constraint.parse_tool_calls:
        raise NotLowerable(
            "bound with tools: the call runs on the client, where its reply is parsed into "
            "tool calls"
        )
    rest.pop("ls_structured_output_format", None)  # LangSmith's, not a sampling field
    return rest, constraint.structured_outputs


@register(ChatEclectus, EclectusLLM, subclasses=True)
async def lower_model_plain(model: Any, value: Any, ctx: Lowering) -> Any:
    return await lower_model(model, value, ctx, {})
