"""Reading a reply whose calls are balanced JSON after a marker, delta by delta: the
machinery behind every format of :mod:`eclectus.protocol.tool_formats`. A format gives a
:class:`Scanner` that finds the next block in a buffer; :class:`BlockStream` holds back text
that may still become a call and hands out content and whole calls. Pure functions but
BlockStream's own state.

A call's end is found by JSON's own syntax (:func:`json_end`: brackets outside strings),
never by searching for a closing marker, because a JSON string may hold any text, the
format's closing tag and opener included. A stream and the whole reply are read by the same
scanner over the same buffer: a scanner holds a block (``end`` None) until more text cannot
change what it finds, so however the reply is cut, the events are the same.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from eclectus.protocol.tools import StreamEvent, ToolCall


class Scanner(Protocol):
    """A format's view of a buffer: where its next block is, and what may follow a call."""

    separator: re.Pattern[str]  # dropped after a call (Llama's "; ")

    def scan(self, buffer: str, final: bool) -> Block:
        """The first block of ``buffer``; ``final``: no more text will come (pure)."""
        ...


@dataclass(frozen=True, slots=True)
class Block:
    """What a format's scanner found at the head of the buffer: ``start`` (text before it
    is content), ``end`` (None: not complete yet, hold from ``start``), ``calls`` (None:
    the block is content after all; empty: a marker that is dropped)."""

    start: int
    end: int | None = None
    calls: list[ToolCall] | None = None


class BlockStream:
    """The stream of a format whose calls are balanced JSON after a marker. Mutated by
    :meth:`feed` / :meth:`finish`."""

    def __init__(self, fmt: Scanner) -> None:
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
            block = self._fmt.scan(self._buffer, final)
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


def json_end(text: str, start: int) -> int | None:
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


def partial_prefix(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that begins ``marker`` (pure)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def skip_space(text: str, start: int) -> int:
    """The index of the first non-whitespace character at or after ``start`` (pure)."""
    while start < len(text) and text[start].isspace():
        start += 1
    return start


def loads_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
