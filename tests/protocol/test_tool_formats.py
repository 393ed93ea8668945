"""Tool-call formats beyond Hermes (Llama-3 JSON, Mistral): detection from real-shaped chat
templates, the calls a template renders parse back, and the streamed reading gives what the
whole-text reading gives, however the text is cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tool_fixtures import WEATHER

from eclectus.protocol.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat
from eclectus.protocol.openai_tools import ChatDeltas, assistant_message, chat_constraint
from eclectus.protocol.tool_formats import (
    TOOL_FORMATS,
    detect_tool_format,
    tool_format,
)

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"
LLAMA3 = (TEMPLATES / "llama3_json.jinja").read_text()
MISTRAL = (TEMPLATES / "mistral.jinja").read_text()
VARS = {"bos_token": "<s>", "eos_token": "</s>"}


def test_the_format_is_detected_from_the_chat_template() -> None:
    """Mistral's [TOOL_CALLS], Llama-3's headers with "parameters", else Hermes."""
    assert detect_tool_format(LLAMA3) == "llama3_json"
    assert detect_tool_format(MISTRAL) == "mistral"
    assert detect_tool_format(DEFAULT_CHAT_TEMPLATE) == "hermes"
    assert detect_tool_format(None) == "hermes"
    assert detect_tool_format("{{ '<|python_tag|>' }}") == "llama3_json"


def test_an_unknown_format_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral"):
        tool_format("pythonic")


def _calls(*pairs: tuple[str, dict[str, object]], ids: list[str] | None = None) -> list[dict]:
    return [
        {
            "id": (ids or [f"call{i:05d}" for i in range(len(pairs))])[i],
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        for i, (name, args) in enumerate(pairs)
    ]


@pytest.mark.parametrize(
    ("template", "name", "begin", "end"),
    [
        (LLAMA3, "llama3_json", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eom_id|>"),
        (MISTRAL, "mistral", "[/INST]", "</s>"),
        (None, "hermes", "<|assistant|>\n", "\n"),
    ],
)
def test_calls_a_template_renders_parse_back_in_its_format(
    template: str | None, name: str, begin: str, end: str
) -> None:
    """Differential: the assistant turn a template writes for two calls reads back, in the
    template's own format, as those two calls and no content."""
    pairs = (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"}))
    messages = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": _calls(*pairs)},
    ]
    text = render_chat(
        template, messages, add_generation_prompt=False, template_vars=VARS, tools=[WEATHER]
    )
    turn = text.rsplit(begin, 1)[1]
    turn = turn[: turn.rindex(end)] if end.strip() else turn
    assert detect_tool_format(template) == name
    content, calls = tool_format(name).parse(turn)
    assert content == ""
    assert [(c.name, c.arguments) for c in calls] == list(pairs)


def test_the_mistral_template_refuses_an_id_that_is_not_nine_alphanumerics() -> None:
    """Why the mistral format makes 9-character ids: its templates check them."""
    bad = [{"role": "user", "content": "hi"}]
    bad.append({"role": "assistant", "tool_calls": _calls(("get_weather", {}), ids=["call_1"])})
    with pytest.raises(Exception, match="length 9"):
        render_chat(MISTRAL, bad, template_vars=VARS)
    _, (call,) = tool_format("mistral").parse('[TOOL_CALLS][{"name": "f", "arguments": {}}]')
    ok = [bad[0], {"role": "assistant", "tool_calls": [{**_calls(("f", {}))[0], "id": call.id}]}]
    assert len(call.id) == 9 and call.id.isalnum()
    render_chat(MISTRAL, ok, template_vars=VARS)


@pytest.mark.parametrize(
    ("name", "text", "content", "calls"),
    [
        ("llama3_json", '{"name": "f", "parameters": {"a": 1}}', "", [("f", {"a": 1})]),
        ("llama3_json", '<|python_tag|>{"name": "f", "arguments": {}}', "", [("f", {})]),
        (
            "llama3_json",
            '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": "}"}}',
            "",
            [("f", {}), ("g", {"x": "}"})],
        ),
        ("llama3_json", "It is sunny.", "It is sunny.", []),
        ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
        ("llama3_json", '{"name": "f", "parameters": {"a": 1}', None, []),  # never closes
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]', "", [("f", {"a": 1})]),
        (
            "mistral",
            'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]',
            "Sure.",
            [("f", {}), ("g", {})],
        ),
        ("mistral", '[TOOL_CALLS]f{"a": [1, 2]}', "", [("f", {"a": [1, 2]})]),  # v11 form
        ("mistral", "[TOOL_CALLS] oops", None, []),
        ("mistral", '[TOOL_CALLS][{"nom": "f"}]', None, []),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "", [("f", {})]),
    ],
)
def test_parse_reads_well_formed_calls_and_leaves_the_rest_as_content(
    name: str, text: str, content: str | None, calls: list[tuple[str, dict]]
) -> None:
    got_content, got_calls = tool_format(name).parse(text)
    assert got_content == (text if content is None else content)
    assert [(c.name, c.arguments) for c in got_calls] == calls


_pieces = {
    "llama3_json": st.sampled_from(
        [
            '{"name": "f", "parameters": {"q": "a;b}{"}}',
            "; ",
            "<|python_tag|>",
            '{"k": [1, {"n": 2}]}',
            "plain words ",
            "<|pyth",
            '"quoted \\" brace {"',
            "{",
            '{"name": "f", "parameters": {"s": "<|python_tag|>{; "}}',
            '"',
        ]
    ),
    "mistral": st.sampled_from(
        [
            '[TOOL_CALLS][{"name": "f", "arguments": {"s": "]["}}]',
            "[TOOL_CALLS]g{}",
            "[TOOL_",
            "text [with] brackets ",
            "[TOOL_CALLS] nope",
            '[TOOL_CALLS][{"name": 1}]',
            '[TOOL_CALLS][{"name": "f", "arguments": {"s": "[TOOL_CALLS]]"}}]',
            '[TOOL_CALLS]f{"s": "[TOOL_CALLS]}"}',
            '"',
        ]
    ),
    "hermes": st.sampled_from(
        [
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
            "<tool_",
            "words ",
            "<tool_call>bad</tool_call>",
            '<tool_call>\n{"name": "f", "arguments": {"s": "</tool_call>"}}\n</tool_call>',
            '<tool_call>{"name": "f", "arguments": {"s": "<tool_call>',
            "<tool_call>{bad</tool_call>",
            "</tool_call>",
            '"',
            "}",
        ]
    ),
}


@pytest.mark.parametrize("name", TOOL_FORMATS)
@given(data=st.data())
def test_streaming_reads_what_parse_reads_however_the_text_is_cut(
    name: str, data: st.DataObject
) -> None:
    """The stream's contents concatenate to parse's content (before stripping) and its
    calls are parse's calls, for random texts cut at random points."""
    text = "".join(data.draw(st.lists(_pieces[name], max_size=6)))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    fmt = tool_format(name)
    stream = fmt.stream()
    events = []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        events += stream.feed(text[start:end])
    events += stream.finish()
    content, calls = fmt.parse(text)
    streamed_calls = [e.call for e in events if e.call is not None]
    streamed = "".join(e.content for e in events)
    assert [(c.name, c.arguments) for c in streamed_calls] == [(c.name, c.arguments) for c in calls]
    assert [e.index for e in events if e.call is not None] == list(range(len(calls)))
    assert (streamed.strip() if calls else text) == content


# Strings made of every format's markers (whole and cut short) and JSON's own syntax
_MARKER_PIECES = (
    "</tool_call>", "<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "</tool_", "<tool_",
    "[TOOL_", "<|pyth", '"', "\\", "{", "}", "[", "]", ";", ", ", ": ", " ", "\n", "a", "é",
)  # fmt: skip
_marker_text = st.one_of(
    st.lists(st.sampled_from(_MARKER_PIECES), max_size=8).map("".join), st.text(max_size=8)
)
_json_values = st.recursive(
    _marker_text | st.integers() | st.booleans() | st.none(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_marker_text, inner, max_size=3),
    max_leaves=8,
)
_arguments = st.dictionaries(_marker_text, _json_values, max_size=4)
_names = st.sampled_from(["get_weather", "f", "search.web-2"])


def _dumps(value: object, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


def _written(name: str, calls: list[tuple[str, dict]], v11: bool, ascii_only: bool) -> str:
    """``calls`` as a model of format ``name`` writes them, separators included (pure)."""
    if name == "hermes":
        blocks = [
            f'<tool_call>\n{{"name": "{n}", "arguments": {_dumps(a, ascii_only)}}}\n</tool_call>'
            for n, a in calls
        ]
        return "\n".join(blocks)
    if name == "llama3_json":
        objects = [_dumps({"name": n, "parameters": a}, ascii_only) for n, a in calls]
        return "<|python_tag|>" + "; ".join(objects)
    if v11:
        return "".join(f"[TOOL_CALLS]{n}{_dumps(a, ascii_only)}" for n, a in calls)
    objects = [_dumps({"name": n, "arguments": a}, ascii_only) for n, a in calls]
    return "[TOOL_CALLS][" + ", ".join(objects) + "]"


@pytest.mark.parametrize("name", TOOL_FORMATS)
@given(data=st.data())
def test_calls_whose_strings_hold_the_markers_parse_whole_and_streamed(
    name: str, data: st.DataObject
) -> None:
    """A JSON string may hold any text, the formats' closing tags and openers included:
    calls as the model writes them parse back exactly, from the whole reply and from a
    stream cut at any points, with the text around them as the content."""
    calls = data.draw(st.lists(st.tuples(_names, _arguments), min_size=1, max_size=3))
    lead = data.draw(st.sampled_from(["", "Sure. ", "Let me check.\n"]))
    text = lead + _written(name, calls, data.draw(st.booleans()), data.draw(st.booleans()))
    trail = data.draw(st.sampled_from(["", "\n", " Done."]))
    text += trail
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    fmt = tool_format(name)
    content, parsed = fmt.parse(text)
    assert [(c.name, c.arguments) for c in parsed] == calls
    stream = fmt.stream()
    events = []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        events += stream.feed(text[start:end])
    events += stream.finish()
    assert [(e.call.name, e.call.arguments) for e in events if e.call] == calls
    streamed = "".join(e.content for e in events)
    assert streamed.strip() == content
    assert content.split() == (lead + trail).split()


def test_the_openai_shapes_use_the_served_format() -> None:
    """chat_constraint with a format: the reply and the stream read that format's calls."""
    body = {"tools": [WEATHER], "tool_choice": "required"}
    constraint = chat_constraint(body, "llama3_json")
    assert constraint.tool_format == "llama3_json" and constraint.parse_tool_calls
    assert constraint.structured_outputs is not None
    tag = json.loads(constraint.structured_outputs.structural_tag or "")
    assert tag["format"]["tags"][0]["begin"] == '{"name": "get_weather", "parameters": '
    text = '{"name": "get_weather", "parameters": {"city": "Rome"}}'
    message, finish = assistant_message(text, "stop", constraint)
    assert finish == "tool_calls" and message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}
    deltas = ChatDeltas(constraint)
    out = deltas.feed(text[:20]) + deltas.feed(text[20:])
    held, finish = deltas.finish("stop")
    (call,) = [d for d in out + held if "tool_calls" in d]
    assert finish == "tool_calls"
    assert call["tool_calls"][0]["function"]["name"] == "get_weather"
