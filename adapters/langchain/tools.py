"""Tools and structured output for ChatEclectus: ``bind_tools``, ``with_structured_output``,
``extra_body``, and the messages that carry calls.

A call's tool kwargs (``tools``, ``tool_choice``, ``parallel_tool_calls``,
``response_format``, ``extra_body``; what ChatOpenAI binds) are read the way the OpenAI
endpoint reads a request body (eclectus.protocol.openai_tools): the tools reach the chat
template as ``tools=``, a forced or well-formed call is enforced by the engine's grammar
(``structured_outputs``), and the reply's calls, in the syntax the server announces for
the model (``ModelCard.tool_call_format``: Hermes ``<tool_call>`` blocks, Llama 3 JSON,
Mistral ``[TOOL_CALLS]``; eclectus.protocol.tool_formats), become ``AIMessage.tool_calls``
(``tool_call_chunks`` when streaming). Past calls and tool results reach the template as
its own ``tool_calls`` / ``tool_call_id`` fields (:func:`.chat_format.message_fields`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.messages.tool import ToolCall as LCToolCall
from langchain_core.messages.tool import ToolCallChunk, tool_call, tool_call_chunk
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool

from eclectus.adapters.langchain.structured_parse import (
    is_pydantic_class,
    ls_format,
    parsed_runnable,
    text_parser,
)
from eclectus.adapters.tool_choice import named_choice, openai_tool_choice
from eclectus.protocol.openai_tools import GUIDED_FIELDS, ChatConstraint, chat_constraint
from eclectus.protocol.tool_formats import ToolFormatName, tool_format
from eclectus.protocol.tools import StreamEvent

# Call kwargs that describe tools and output formats rather than sampling.
TOOL_KWARGS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
# extra_body keys (vLLM's extensions, as ChatOpenAI passes them) that are sampling keys
_EXTRA_SAMPLING = frozenset({"top_k", "ignore_eos", "seed", "stop", "max_tokens"})
_EXTRA_FORMATS = frozenset({"structured_outputs", *GUIDED_FIELDS})

StructuredMethod = Literal["function_calling", "json_mode", "json_schema"]


def tool_choice_of(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> Any:
    """ChatOpenAI's accepted ``tool_choice`` forms in OpenAI's shape (pure): a tool's bare
    name, ``"any"`` (= required), ``True`` (the only tool), or OpenAI's own values."""
    if tool_choice is None:
        return None
    if tool_choice is True:
        if len(tools) != 1:
            raise ValueError("tool_choice=True needs exactly one tool")
        return named_choice(tools[0]["function"]["name"])
    return openai_tool_choice(tool_choice)


def split_call_kwargs(
    kwargs: Mapping[str, Any],
    default_extra_body: Mapping[str, Any] | None,
    tool_format_name: ToolFormatName = "hermes",
) -> tuple[dict[str, Any], ChatConstraint]:
    """A call's kwargs as (sampling kwargs, tools/format constraint) for a model writing
    calls in ``tool_format_name`` (pure). ``extra_body`` (the model's, then the call's) adds
    vLLM's sampling keys and output formats. Raises ValueError naming a field that is
    wrong."""
    rest = {k: v for k, v in kwargs.items() if k not in (*TOOL_KWARGS, "extra_body")}
    body = {k: kwargs[k] for k in TOOL_KWARGS if kwargs.get(k) is not None}
    extra = {**(default_extra_body or {}), **(kwargs.get("extra_body") or {})}
    for key, value in extra.items():
        if key in _EXTRA_SAMPLING:
            rest.setdefault(key, value)
        elif key in _EXTRA_FORMATS:
            body[key] = value
        else:
            raise ValueError(f"extra_body: {key!r} is not supported by Eclectus")
    return rest, chat_constraint(body, tool_format_name)


def reply_parts(text: str, constraint: ChatConstraint) -> tuple[str, list[LCToolCall]]:
    """A reply's content and LangChain tool calls (pure)."""
    if not constraint.parse_tool_calls:
        return text, []
    content, calls = tool_format(constraint.tool_format).parse(text)
    return content, [tool_call(name=c.name, args=c.arguments, id=c.id) for c in calls]


class ChunkReader:
    """Streamed text to (content, tool_call_chunks) pieces (mutated by feed/finish)."""

    def __init__(self, constraint: ChatConstraint) -> None:
        fmt = tool_format(constraint.tool_format)
        self._stream = fmt.stream() if constraint.parse_tool_calls else None
        self.num_calls = 0

    def feed(self, delta: str) -> list[tuple[str, list[ToolCallChunk]]]:
        if self._stream is None:
            return [(delta, [])]
        return [self._piece(e) for e in self._stream.feed(delta)]

    def finish(self) -> list[tuple[str, list[ToolCallChunk]]]:
        return [] if self._stream is None else [self._piece(e) for e in self._stream.finish()]

    def _piece(self, event: StreamEvent) -> tuple[str, list[ToolCallChunk]]:
        if event.call is None:
            return event.content, []
        self.num_calls += 1
        args = json.dumps(event.call.arguments, ensure_ascii=False)
        chunk = tool_call_chunk(
            name=event.call.name, args=args, id=event.call.id, index=event.index
        )
        return "", [chunk]


def structured_runnable(
    bind: Callable[..., Runnable],
    bind_tools: Callable[..., Runnable],
    schema: Any,
    method: StructuredMethod,
    include_raw: bool,
) -> Runnable:
    """``with_structured_output``'s runnable: the bound model and its parser (pure).

    ``json_schema``: the reply is constrained to the schema (``response_format``);
    ``function_calling``: one forced call of the schema as a tool; ``json_mode``: held to the
    schema when one is given, else any JSON object.
    """
    parser: Runnable
    if method == "function_calling":
        if schema is None:
            raise ValueError("method='function_calling' needs a schema")
        tool = convert_to_openai_tool(schema)
        llm = bind_tools([schema], tool_choice=tool["function"]["name"], parallel_tool_calls=False)
        if is_pydantic_class(schema):
            parser = PydanticToolsParser(tools=[schema], first_tool_only=True)
        else:
            parser = JsonOutputKeyToolsParser(
                key_name=tool["function"]["name"], first_tool_only=True
            )
    elif method in ("json_schema", "json_mode"):
        # json_mode with a schema is held to it (OpenAI's json_object mode only promises
        # "an object"); without one, any JSON object
        if schema is None and method == "json_schema":
            raise ValueError("method='json_schema' needs a schema")
        response_format: dict[str, Any] = {"type": "json_object"}
        if schema is not None:
            json_schema = convert_to_json_schema(schema)
            name = json_schema.get("title", "output")
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": json_schema},
            }
        llm = bind(
            response_format=response_format, ls_structured_output_format=ls_format(schema, method)
        )
        parser = text_parser(schema)
    else:
        raise ValueError(
            f"method is 'function_calling', 'json_schema' or 'json_mode', not {method!r}"
        )
    return parsed_runnable(llm, parser, include_raw)
