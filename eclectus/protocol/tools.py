"""Tool calls: the declared tools, a parsed call, and the Hermes format's constraint (its
parser, with the other formats', is :mod:`eclectus.protocol.tool_formats`). Torch-free: the
OpenAI endpoint and the client adapters share it.

The format (Hermes, Qwen 2/2.5/3, the ``tiny`` preset) writes each call as::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``tool_choice`` is OpenAI's: ``"none"`` (no constraint, the text is not parsed for calls),
``"auto"`` (free text; once the model writes ``<tool_call>`` the call is constrained to a
declared tool with valid arguments), ``"required"`` (one or more calls, nothing else) or
``{"type": "function", "function": {"name": ...}}`` (exactly that tool). With
``parallel_tool_calls`` false, at most one call. The constraint is an xgrammar structural
tag (``StructuredOutputs.structural_tag``), one tag per tool whose content is the tool's
parameter schema.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from eclectus.protocol.structured import StructuredOutputs

CALL_BEGIN, CALL_END = "<tool_call>", "</tool_call>"
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

ToolChoice = Literal["none", "auto", "required"] | Mapping[str, Any] | str


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One declared function: its name, description, JSON Schema of the arguments and
    OpenAI's ``strict`` flag, as the request gave them (None: not given)."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None
    strict: bool | None = None

    @classmethod
    def of(cls, tool: Mapping[str, Any]) -> ToolSpec:
        """From OpenAI's ``{"type": "function", "function": {...}}`` (or the inner object).
        Raises ValueError naming what is missing."""
        function = (
            tool.get("function", tool) if tool.get("type", "function") == "function" else None
        )
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(
                f"a tool is {{'type': 'function', 'function': {{'name': ...}}}}: {tool!r}"
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ValueError(f"tool {function['name']!r}: parameters must be a JSON Schema object")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"tool {function['name']!r}: strict must be true, false or null")
        description = function.get("description")
        return cls(
            function["name"], None if description is None else str(description), parameters, strict
        )

    def openai(self) -> dict[str, Any]:
        """OpenAI's tool object as chat templates get it: the shape vLLM passes them (its
        ``ChatCompletionToolsParam`` dumped: ``description`` and ``parameters`` null when not
        given, ``strict`` only when given), so a template renders the same prompt (pure)."""
        function: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": None if self.parameters is None else dict(self.parameters),
        }
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A parsed call: OpenAI's ``tool_calls`` entry with ``arguments`` as a dict."""

    id: str
    name: str
    arguments: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """OpenAI's ``{"id", "type": "function", "function": {"name", "arguments"}}``; the
        arguments as JSON text, as OpenAI sends them (pure)."""
        args = json.dumps(self.arguments, ensure_ascii=False)
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": args},
        }


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def chosen_tools(tools: Sequence[ToolSpec], tool_choice: ToolChoice | None) -> list[ToolSpec]:
    """The tools a call may use under ``tool_choice`` (pure). Raises ValueError for an
    unknown choice or a named tool that was not declared."""
    if tool_choice in (None, "auto", "required", "any"):
        return list(tools)
    if tool_choice == "none":
        return []
    name = _named(tool_choice)
    picked = [t for t in tools if t.name == name]
    if not picked:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    return picked


def _named(tool_choice: ToolChoice) -> str:
    if isinstance(tool_choice, str):
        return tool_choice  # LangChain's shorthand: a bare tool name
    function = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return function["name"]
    if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("name"), str):
        return tool_choice["name"]
    raise ValueError(
        "tool_choice is 'none', 'auto', 'required' or "
        f"{{'type': 'function', 'function': {{'name': ...}}}}, not {tool_choice!r}"
    )


def tool_call_constraint(
    tools: Sequence[ToolSpec], tool_choice: ToolChoice | None = "auto", parallel: bool = True
) -> StructuredOutputs | None:
    """The constraint enforcing ``tool_choice`` over ``tools`` in the Hermes format, or None
    when nothing is constrained (no tools, or ``"none"``). Pure; ValueError as
    :func:`chosen_tools`."""
    picked = chosen_tools(tools, tool_choice)
    if not picked:
        return None
    tags = [_tag(t) for t in picked]
    if tool_choice in (None, "auto"):
        fmt: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": [CALL_BEGIN],
            "tags": tags,
            "stop_after_first": not parallel,
        }
    else:  # required (LangChain: "any"): calls only, one or more; a named tool: one call
        named = tool_choice not in ("required", "any")
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": named or not parallel,
        }
    return StructuredOutputs(structural_tag={"type": "structural_tag", "format": fmt})


def _tag(tool: ToolSpec) -> dict[str, Any]:
    begin = f'{CALL_BEGIN}\n{{"name": {json.dumps(tool.name, ensure_ascii=False)}, "arguments": '
    schema = dict(tool.parameters or _EMPTY_PARAMETERS)
    return {
        "type": "tag",
        "begin": begin,
        "content": {"type": "json_schema", "json_schema": schema},
        "end": f"}}\n{CALL_END}",
    }


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call as the model writes it (for rendering an assistant turn back, pure)."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{CALL_BEGIN}\n{body}\n{CALL_END}"


def call_from(data: Any, keys: tuple[str, ...], new_id: Callable[[], str]) -> ToolCall | None:
    """A call from a decoded object with a str ``name`` and its arguments under the first
    of ``keys`` present (an object, or its JSON text, as some models write them), with an id
    from ``new_id``; None if it is not one (pure but for the id)."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    key = next((k for k in keys if k in data), None)
    arguments = {} if key is None else data[key]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_id(), data["name"], arguments)


@dataclass(slots=True)
class StreamEvent:
    """A piece of a streamed reply: text (``content``) or one complete call (``call``, its
    ``index`` among the reply's calls)."""

    content: str = ""
    call: ToolCall | None = None
    index: int = 0


def tool_specs(tools: Iterable[Mapping[str, Any]] | None) -> list[ToolSpec]:
    """OpenAI tool objects to ToolSpecs (pure); ValueError names a malformed one."""
    specs = [ToolSpec.of(t) for t in tools or ()]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique: {names}")
    return specs
