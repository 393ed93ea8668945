"""Hermes tool calls: the constraint per tool_choice, the parser, the streaming parser, and
the chat template's ``tools``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tool_fixtures import weather_tool

from eclectus.protocol.chat_template import render_chat, render_chat_pieces
from eclectus.protocol.tool_formats import tool_format
from eclectus.protocol.tools import (
    ToolSpec,
    format_tool_call,
    tool_call_constraint,
    tool_specs,
)

WEATHER = weather_tool("Weather of a city")
HERMES = tool_format("hermes")
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def fmt(choice: object, parallel: bool = True) -> dict:
    constraint = tool_call_constraint(tool_specs([WEATHER, ADD]), choice, parallel)  # type: ignore[arg-type]
    assert constraint is not None and constraint.structural_tag is not None
    return json.loads(constraint.structural_tag)["format"]


def test_tool_choice_picks_the_structure() -> None:
    assert fmt("auto")["type"] == "triggered_tags"
    assert fmt("auto", parallel=False)["stop_after_first"] is True
    required = fmt("required")
    assert required["type"] == "tags_with_separator" and required["at_least_one"]
    assert not required["stop_after_first"]
    named = fmt({"type": "function", "function": {"name": "add"}})
    assert [t["begin"] for t in named["tags"]] == ['<tool_call>\n{"name": "add", "arguments": ']
    assert named["stop_after_first"]
    assert tool_call_constraint(tool_specs([WEATHER]), "none") is None


def test_bad_tools_and_choices_are_named() -> None:
    with pytest.raises(ValueError, match="not among the tools"):
        tool_call_constraint(tool_specs([WEATHER]), {"type": "function", "function": {"name": "x"}})
    with pytest.raises(ValueError, match="unique"):
        tool_specs([WEATHER, WEATHER])
    with pytest.raises(ValueError, match="a tool is"):
        ToolSpec.of({"type": "function", "function": {}})


def test_parse_splits_content_and_calls() -> None:
    text = "Let me check.\n" + format_tool_call("get_weather", {"city": "Paris"}) + "\n"
    text += format_tool_call("add", {"a": 1}) + "<tool_call>not json</tool_call>"
    content, calls = HERMES.parse(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1}),
    ]
    assert content == "Let me check.\n\n<tool_call>not json</tool_call>"
    assert len({c.id for c in calls}) == 2
    assert json.loads(calls[0].openai()["function"]["arguments"]) == {"city": "Paris"}
    assert HERMES.parse("plain") == ("plain", [])


@given(st.lists(st.integers(1, 7), min_size=1, max_size=40), st.text(max_size=20))
def test_stream_events_equal_the_whole_parse(cuts: list[int], lead: str) -> None:
    """However the text is cut into deltas, the streamed content and calls equal
    the parse of the whole text."""
    text = (
        lead.replace("<", "")
        + format_tool_call("add", {"a": 1})
        + " then "
        + (format_tool_call("get_weather", {"city": "Oslo"}))
    )
    stream, events, pos = HERMES.stream(), [], 0
    for cut in cuts * 50:
        if pos >= len(text):
            break
        events += stream.feed(text[pos : pos + cut])
        pos += cut
    events += stream.feed(text[pos:]) + stream.finish()
    content = "".join(e.content for e in events)
    calls = [(e.index, e.call.name, e.call.arguments) for e in events if e.call]
    whole_content, whole_calls = HERMES.parse(text)
    assert content.strip() == whole_content
    assert calls == [(i, c.name, c.arguments) for i, c in enumerate(whole_calls)]


def test_templates_receive_tools_and_keep_pieces() -> None:
    messages = [{"role": "user", "content": "weather?"}]
    plain = render_chat(None, messages)
    assert plain == "<|user|>\nweather?\n<|assistant|>\n"  # unchanged without tools
    with_tools = render_chat(None, messages, tools=[WEATHER])
    assert with_tools.endswith(plain) and '"name": "get_weather"' in with_tools
    custom = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{{ messages[0].content }}"
    assert render_chat(custom, messages, tools=[WEATHER, ADD]) == "[get_weather][add]weather?"
    pieces = render_chat_pieces(
        None, [("user", ["a", 7])], text_of=lambda p: str(p), tools=[WEATHER]
    )
    assert 7 in pieces and '"get_weather"' in "".join(p for p in pieces if isinstance(p, str))
