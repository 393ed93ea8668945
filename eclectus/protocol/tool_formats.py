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

import random
import re
import string
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from eclectus.protocol.structural_tags import (
    at_most_one,
    call_tag,
    json_string,
    structural_tag,
    tags_with_separator,
    triggered_tags,
)
from eclectus.protocol.structured import StructuredOutputs
from eclectus.protocol.tool_scan import (
    Block,
    BlockStream,
    json_end,
    loads_or_none,
    partial_prefix,
    skip_space,
)
from eclectus.protocol.tools import (
    CALL_BEGIN,
    CALL_END,
    StreamEvent,
    ToolCall,
    ToolChoice,
    ToolSpec,
    call_from,
    chosen_tools,
    new_call_id,
    tool_call_constraint,
)

ToolFormatName = Literal["hermes", "llama3_json", "mistral"]
TOOL_FORMATS: tuple[ToolFormatName, ...] = ("hermes", "llama3_json", "mistral")

PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
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


class _BlockFormat(ToolFormat):
    """A format read by :class:`BlockStream`: :meth:`scan` finds the next block."""

    separator = re.compile(r"\s*")

    def stream(self) -> CallStream:
        return BlockStream(self)

    @abstractmethod
    def scan(self, buffer: str, final: bool) -> Block:
        """The first block of ``buffer``; ``final``: no more text will come (pure)."""

    def _call(self, data: Any, keys: tuple[str, ...]) -> ToolCall | None:
        """A call from a decoded object (tools.call_from), with this format's ids."""
        return call_from(data, keys, self.new_id)

    def new_id(self) -> str:
        return new_call_id()


class HermesFormat(_BlockFormat):
    """``<tool_call>{...}</tool_call>`` blocks (constraint: eclectus.protocol.tools)."""

    name: ToolFormatName = "hermes"
    separator = re.compile("")  # text between calls stays content

    def constraint(
        self, tools: Sequence[ToolSpec], tool_choice: ToolChoice | None, parallel: bool = True
    ) -> StructuredOutputs | None:
        return tool_call_constraint(tools, tool_choice, parallel)

    def scan(self, buffer: str, final: bool) -> Block:
        start = buffer.find(CALL_BEGIN)
        if start < 0:
            return Block(len(buffer) - partial_prefix(buffer, CALL_BEGIN))
        body = skip_space(buffer, start + len(CALL_BEGIN))
        if body == len(buffer) and not final:
            return Block(start)
        if body < len(buffer) and buffer[body] == "{":
            # the object ends where its brackets close, whatever its strings hold
            end = json_end(buffer, body)
            close = None if end is None else skip_space(buffer, end)
            if close is not None and buffer.startswith(CALL_END, close):
                call = self._call(loads_or_none(buffer[body:end]), ("arguments", "parameters"))
                if call is not None:
                    return Block(start, close + len(CALL_END), [call])
            elif not final and (close is None or CALL_END.startswith(buffer[close:])):
                return Block(start)  # the object, or the tag after it, may still come
        # not a call: content through the first closing tag, as vLLM's hermes parser reads it
        stop = buffer.find(CALL_END, start + len(CALL_BEGIN))
        return Block(start) if stop < 0 else Block(start, stop + len(CALL_END), None)


class _JsonFormat(_BlockFormat):
    """A format whose constraint is a structural tag of one tag per tool, built here."""

    arguments_key: str  # the key a call's arguments stand under, beside "name"

    def constraint(
        self, tools: Sequence[ToolSpec], tool_choice: ToolChoice | None, parallel: bool = True
    ) -> StructuredOutputs | None:
        picked = chosen_tools(tools, tool_choice)
        if not picked:
            return None
        key = self.arguments_key
        tags = [call_tag(f'{{"name": {json_string(t.name)}, "{key}": ', t, "}") for t in picked]
        return structural_tag(self._structure(tags, tool_choice, parallel))

    @abstractmethod
    def _structure(
        self, tags: list[dict[str, Any]], tool_choice: ToolChoice | None, parallel: bool
    ) -> dict[str, Any]:
        """The structural tag's format around the call ``tags``, one per chosen tool
        (pure)."""


class Llama3JsonFormat(_JsonFormat):
    """``{"name": ..., "parameters": {...}}`` objects, ``;``-separated, maybe after
    ``<|python_tag|>`` (vLLM's ``llama3_json``)."""

    name: ToolFormatName = "llama3_json"
    separator = re.compile(r"\s*(?:;\s*)?")

    arguments_key = "parameters"

    def _structure(
        self, tags: list[dict[str, Any]], tool_choice: ToolChoice | None, parallel: bool
    ) -> dict[str, Any]:
        if tool_choice in (None, "auto"):  # any "{" opens a call: the reply's JSON objects
            return triggered_tags(["{"], tags, not parallel)  # are all calls, as vLLM reads them
        return tags_with_separator(tags, "; ", at_most_one(tool_choice, parallel))

    def scan(self, buffer: str, final: bool) -> Block:
        brace, tag = buffer.find("{"), buffer.find(PYTHON_TAG)
        if tag >= 0 and (brace < 0 or tag < brace):
            return Block(tag, tag + len(PYTHON_TAG), [])  # the tag itself is dropped
        if brace < 0:
            return Block(len(buffer) - partial_prefix(buffer, PYTHON_TAG))
        end = json_end(buffer, brace)
        if end is None:
            return Block(brace)
        call = self._call(loads_or_none(buffer[brace:end]), ("parameters", "arguments"))
        return Block(brace, end, None if call is None else [call])


class MistralFormat(_JsonFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (vLLM's ``mistral``), and
    the v11 form ``[TOOL_CALLS]name{...}``."""

    name: ToolFormatName = "mistral"

    arguments_key = "arguments"

    def _structure(
        self, tags: list[dict[str, Any]], tool_choice: ToolChoice | None, parallel: bool
    ) -> dict[str, Any]:
        calls = tags_with_separator(tags, ", ", at_most_one(tool_choice, parallel))
        if tool_choice in (None, "auto"):
            block = {"type": "tag", "begin": f"{MISTRAL_TOOL_CALLS}[", "content": calls}
            return triggered_tags([MISTRAL_TOOL_CALLS], [{**block, "end": "]"}], True)
        return {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": f"{MISTRAL_TOOL_CALLS}["},
                calls,
                {"type": "const_string", "value": "]"},
            ],
        }

    def scan(self, buffer: str, final: bool) -> Block:
        start = buffer.find(MISTRAL_TOOL_CALLS)
        if start < 0:
            return Block(len(buffer) - partial_prefix(buffer, MISTRAL_TOOL_CALLS))
        body = skip_space(buffer, start + len(MISTRAL_TOOL_CALLS))
        if body == len(buffer):
            return Block(start)
        if buffer[body] == "[":
            end = json_end(buffer, body)
            if end is None:
                return Block(start)
            return Block(start, end, self._array(loads_or_none(buffer[body:end])))
        name = _MISTRAL_NAME.match(buffer, body)
        if name is None:
            return Block(start, body, None)
        if name.end() == len(buffer):
            return Block(start)
        if buffer[name.end()] != "{":
            return Block(start, name.end(), None)
        end = json_end(buffer, name.end())
        if end is None:
            return Block(start)
        arguments = loads_or_none(buffer[name.end() : end])
        call = self._call({"name": name.group(), "arguments": arguments}, ("arguments",))
        return Block(start, end, None if call is None else [call])

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
