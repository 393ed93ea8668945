"""Tool-call formats: how a model family writes its calls, the constraint that makes it write
them well-formed, and the parser that reads them back (whole text and streamed deltas).
Torch-free: the OpenAI endpoint, the client adapters and the remote engines share it.

Three formats, named as vLLM's ``--tool-call-parser`` names them:

* ``hermes`` (Hermes, Qwen 2/2.5/3, the ``tiny`` preset): each call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (eclectus.protocol.tools).
* ``llama3_json`` (Llama 3.1/3.2/3.3 with JSON tool calling): a call is a JSON object
  ``{"name": ..., "parameters": {...}}`` (``"arguments"`` is read too), optionally after
  ``<|python_tag|>``; several calls are separated by ``;``.
* ``mistral`` (Mistral 7B v0.3, Nemo...): ``[TOOL_CALLS]`` then a JSON array of
  ``{"name": ..., "arguments": {...}}`` objects; the v11 form ``[TOOL_CALLS]name{...}`` is
  read too. Call ids are 9 alphanumerics, as Mistral's templates require.

A served model's format is :func:`detect_tool_format` of its chat template unless the
server is told otherwise (``eclectus serve --tool-call-parser``). Each :class:`ToolFormat`
gives :meth:`~ToolFormat.constraint` (the ``StructuredOutputs`` enforcing ``tool_choice``:
for ``required`` / a named tool, calls in this format and nothing else; for ``auto``, free
text, and once the text writes the format's call opener (``<tool_call>``, ``{`` for Llama,
whose parser reads any JSON object as a call, ``[TOOL_CALLS]``), a well-formed call of a
declared tool),
:meth:`~ToolFormat.parse` (content and calls of a whole reply) and
:meth:`~ToolFormat.stream` (the same, delta by delta: the events' contents concatenate to
what :meth:`~ToolFormat.parse` gives before stripping, and the calls are the same).
"""

from __future__ import annotations

import json
import random
import re
import string
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from eclectus.protocol.structured import StructuredOutputs
from eclectus.protocol.tools import (
    StreamEvent,
    ToolCall,
    ToolCallStream,
    ToolChoice,
    ToolSpec,
    chosen_tools,
    new_call_id,
    parse_tool_calls,
    tool_call_constraint,
)

ToolFormatName = Literal["hermes", "llama3_json", "mistral"]
TOOL_FORMATS: tuple[ToolFormatName, ...] = ("hermes", "llama3_json", "mistral")

PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_MISTRAL_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def detect_tool_format(chat_template: str | None) -> ToolFormatName:
    """The tool-call format a chat template teaches its model (pure): ``mistral`` when it
    writes ``[TOOL_CALLS]``, ``llama3_json`` for a Llama-3 template (``<|python_tag|>``, or
    Llama's header tokens with ``"parameters"``), else ``hermes`` (also for no template:
    the built-in default template uses it)."""
    text = chat_template or ""
    if MISTRAL_TOOL_CALLS in text:
        return "mistral"
    if PYTHON_TAG in text or ("<|start_header_id|>" in text and "parameters" in text):
        return "llama3_json"
    return "hermes"


def tool_format(name: str) -> ToolFormat:
    """The format called ``name`` (one of :data:`TOOL_FORMATS`); ValueError otherwise."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(
            f"tool-call format {name!r} is unknown: one of {', '.join(TOOL_FORMATS)}"
        ) from None


class CallStream(Protocol):
    """Reads one streamed reply (mutated by :meth:`feed` and :meth:`finish`)."""

    def feed(self, delta: str) -> list[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]: ...


class ToolFormat(ABC):
    """One family's call syntax. Stateless: every method is pure but :meth:`stream`'s
    result."""

    name: ToolFormatName

    @abstractmethod
    def constraint(
        self, tools: Sequence[ToolSpec], tool_choice: ToolChoice | None, parallel: bool = True
    ) -> StructuredOutputs | None:
        """The constraint enforcing ``tool_choice`` over ``tools``, or None when nothing is
        constrained (no tools, or ``"none"``). ValueError as :func:`chosen_tools`."""

    @abstractmethod
    def stream(self) -> CallStream:
        """A fresh reader of one streamed reply."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """``text``'s content and well-formed calls; with calls, the content is stripped
        (pure). Malformed call syntax stays in the content."""
        stream = self.stream()
        events = stream.feed(text) + stream.finish()
        calls = [e.call for e in events if e.call is not None]
        content = "".join(e.content for e in events)
        return (content.strip(), calls) if calls else (text, [])


class HermesFormat(ToolFormat):
    """``<tool_call>{...}</tool_call>`` blocks (eclectus.protocol.tools)."""

    name: ToolFormatName = "hermes"

    def constraint(
        self, tools: Sequence[ToolSpec], tool_choice: ToolChoice | None, parallel: bool = True
    ) -> StructuredOutputs | None:
        return tool_call_constraint(tools, tool_choice, parallel)

    def stream(self) -> CallStream:
        return ToolCallStream()

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return parse_tool_calls(text)


@dataclass(frozen=True, slots=True)
class _Block:
    """What a format's scanner found at the head of the buffer: ``start`` (text before it
    is content), ``end`` (None: not complete yet, hold from ``start``), ``calls`` (None:
    the block is content after all; empty: a marker that is dropped)."""

    start: int
    end: int | None = None
    calls: list[ToolCall] | None = None


class _BlockStream:
    """The stream of a format whose calls are balanced JSON after a marker. Mutated by
    :meth:`feed` / :meth:`finish`."""

    def __init__(self, fmt: _JsonFormat) -> None:
        self._fmt = fmt
        self._buffer = ""
        self._num_calls = 0
        self._after_call = False

    def feed(self, delta: str) -> list[StreamEvent]:
        """Events made complete by ``delta`` (mutates)."""
        self._buffer += delta
        return self._drain(final=False)

    def finish(self) -> list[StreamEvent]:
        """Everything still held (mutates: the stream is drained)."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while self._buffer:
            if self._after_call:  # a separator after a call belongs to the call syntax
                cut = self._fmt.separator.match(self._buffer)
                length = cut.end() if cut else 0
                if length == len(self._buffer) and not final:
                    break
                self._buffer, self._after_call = self._buffer[length:], False
                continue
            block = self._fmt.scan(self._buffer)
            if block.start:
                events.append(StreamEvent(content=self._buffer[: block.start]))
            if block.end is None:
                self._buffer = self._buffer[block.start :]
                if final and self._buffer:
                    events.append(StreamEvent(content=self._buffer))
                    self._buffer = ""
                break
            text = self._buffer[block.start : block.end]
            self._buffer = self._buffer[block.end :]
            if block.calls is None:
                events.append(StreamEvent(content=text))
                continue
            for call in block.calls:
                events.append(StreamEvent(call=call, index=self._num_calls))
                self._num_calls += 1
            self._after_call = bool(block.calls)
        return events


class _JsonFormat(ToolFormat):
    """A format read by :class:`_BlockStream`: :meth:`scan` finds the next block."""

    separator = re.compile(r"\s*")

    def stream(self) -> CallStream:
        return _BlockStream(self)

    @abstractmethod
    def scan(self, buffer: str) -> _Block:
        """The first block of ``buffer`` (pure)."""

    def _call(self, data: Any, keys: tuple[str, ...]) -> ToolCall | None:
        """A call from a decoded object with a str ``name`` and its arguments under the
        first of ``keys`` present (an object, or its JSON text); None if it is not one."""
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
        return ToolCall(self.new_id(), data["name"], arguments)

    def new_id(self) -> str:
        return new_call_id()


class Llama3JsonFormat(_JsonFormat):
    """``{"name": ..., "parameters": {...}}`` objects, ``;``-separated, maybe after
    ``<|python_tag|>`` (vLLM's ``llama3_json``)."""

    name: ToolFormatName = "llama3_json"
    separator = re.compile(r"\s*(?:;\s*)?")

    def constraint(
        self, tools: Sequence[ToolSpec], tool_choice: ToolChoice | None, parallel: bool = True
    ) -> StructuredOutputs | None:
        picked = chosen_tools(tools, tool_choice)
        if not picked:
            return None
        tags = [_tag(f'{{"name": {_quoted(t.name)}, "parameters": ', t, "}") for t in picked]
        if tool_choice in (None, "auto"):  # any "{" opens a call: the reply's JSON objects
            fmt = _triggered(["{"], tags, not parallel)  # are all calls, as vLLM reads them
        else:
            fmt = _separated(tags, "; ", _single(tool_choice, parallel))
        return _structural(fmt)

    def scan(self, buffer: str) -> _Block:
        brace, tag = buffer.find("{"), buffer.find(PYTHON_TAG)
        if tag >= 0 and (brace < 0 or tag < brace):
            return _Block(tag, tag + len(PYTHON_TAG), [])  # the tag itself is dropped
        if brace < 0:
            return _Block(len(buffer) - _partial_prefix(buffer, PYTHON_TAG))
        end = _json_end(buffer, brace)
        if end is None:
            return _Block(brace)
        call = self._call(_loads(buffer[brace:end]), ("parameters", "arguments"))
        return _Block(brace, end, None if call is None else [call])


class MistralFormat(_JsonFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (vLLM's ``mistral``), and
    the v11 form ``[TOOL_CALLS]name{...}``."""

    name: ToolFormatName = "mistral"

    def constraint(
        self, tools: Sequence[ToolSpec], tool_choice: ToolChoice | None, parallel: bool = True
    ) -> StructuredOutputs | None:
        picked = chosen_tools(tools, tool_choice)
        if not picked:
            return None
        tags = [_tag(f'{{"name": {_quoted(t.name)}, "arguments": ', t, "}") for t in picked]
        calls = _separated(tags, ", ", _single(tool_choice, parallel))
        if tool_choice in (None, "auto"):
            block = {"type": "tag", "begin": f"{MISTRAL_TOOL_CALLS}[", "content": calls}
            fmt = _triggered([MISTRAL_TOOL_CALLS], [{**block, "end": "]"}], True)
        else:
            fmt = {
                "type": "sequence",
                "elements": [
                    {"type": "const_string", "value": f"{MISTRAL_TOOL_CALLS}["},
                    calls,
                    {"type": "const_string", "value": "]"},
                ],
            }
        return _structural(fmt)

    def scan(self, buffer: str) -> _Block:
        start = buffer.find(MISTRAL_TOOL_CALLS)
        if start < 0:
            return _Block(len(buffer) - _partial_prefix(buffer, MISTRAL_TOOL_CALLS))
        body = start + len(MISTRAL_TOOL_CALLS)
        while body < len(buffer) and buffer[body].isspace():
            body += 1
        if body == len(buffer):
            return _Block(start)
        if buffer[body] == "[":
            end = _json_end(buffer, body)
            if end is None:
                return _Block(start)
            return _Block(start, end, self._array(_loads(buffer[body:end])))
        name = _MISTRAL_NAME.match(buffer, body)
        if name is None:
            return _Block(start, body, None)
        if name.end() == len(buffer):
            return _Block(start)
        if buffer[name.end()] != "{":
            return _Block(start, name.end(), None)
        end = _json_end(buffer, name.end())
        if end is None:
            return _Block(start)
        arguments = _loads(buffer[name.end() : end])
        call = self._call({"name": name.group(), "arguments": arguments}, ("arguments",))
        return _Block(start, end, None if call is None else [call])

    def _array(self, data: Any) -> list[ToolCall] | None:
        if not isinstance(data, list) or not data:
            return None
        calls = [self._call(item, ("arguments", "parameters")) for item in data]
        return None if any(c is None for c in calls) else calls  # type: ignore[return-value]

    def new_id(self) -> str:
        # Mistral's templates refuse an id that is not 9 alphanumerics
        return "".join(random.choices(string.ascii_letters + string.digits, k=9))


_FORMATS: dict[str, ToolFormat] = {
    "hermes": HermesFormat(),
    "llama3_json": Llama3JsonFormat(),
    "mistral": MistralFormat(),
}


# ---- structural-tag pieces -------------------------------------------------------------------


def _quoted(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def _tag(begin: str, tool: ToolSpec, end: str) -> dict[str, Any]:
    schema = dict(tool.parameters or _EMPTY_PARAMETERS)
    content = {"type": "json_schema", "json_schema": schema}
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _single(tool_choice: ToolChoice | None, parallel: bool) -> bool:
    """Whether at most one call is allowed: a named tool, or parallel calls off."""
    return tool_choice not in (None, "auto", "required", "any") or not parallel


def _triggered(triggers: list[str], tags: list[dict[str, Any]], single: bool) -> dict[str, Any]:
    return {
        "type": "triggered_tags",
        "triggers": triggers,
        "tags": tags,
        "stop_after_first": single,
    }


def _separated(tags: list[dict[str, Any]], separator: str, single: bool) -> dict[str, Any]:
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": single,
    }


def _structural(fmt: Mapping[str, Any]) -> StructuredOutputs:
    return StructuredOutputs(structural_tag={"type": "structural_tag", "format": dict(fmt)})


# ---- scanning ---------------------------------------------------------------------------------


def _json_end(text: str, start: int) -> int | None:
    """The index just past the JSON object or array opening at ``text[start]``, by bracket
    depth outside strings, or None when it has not closed yet (pure)."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _partial_prefix(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that begins ``marker`` (pure)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
