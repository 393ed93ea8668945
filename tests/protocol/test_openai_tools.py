"""OpenAI-shape tools and formats -> SamplingParams; replies -> message / deltas; and a
round trip through the real engine: a forced call comes back as a valid tool_calls entry."""

from __future__ import annotations

import json

import jsonschema
import pytest
from tool_fixtures import weather_tool

from eclectus.protocol import SamplingParams
from eclectus.protocol.chat_template import render_chat
from eclectus.protocol.openai_tools import (
    ChatConstraint,
    ChatDeltas,
    ToolRequestError,
    assistant_message,
    chat_constraint,
    with_constraint,
)
from eclectus.protocol.tools import format_tool_call

WEATHER = weather_tool(description=None, max_city_length=10)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_formats_become_structured_outputs() -> None:
    assert chat_constraint({}).structured_outputs is None
    assert chat_constraint({"response_format": {"type": "text"}}).structured_outputs is None
    obj = chat_constraint({"response_format": {"type": "json_object"}}).structured_outputs
    assert obj is not None and obj.kind == "json_object"
    body = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
    }
    assert chat_constraint(body).structured_outputs.schema_object == SCHEMA  # type: ignore[union-attr]
    vllm = chat_constraint({"structured_outputs": {"regex": "a+"}}).structured_outputs
    assert vllm is not None and vllm.regex == "a+"
    guided = chat_constraint({"guided_choice": ["x", "y"]}).structured_outputs
    assert guided is not None and guided.choice == ("x", "y")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"regex": "("}}, "structured_outputs"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
    ],
)
def test_bad_requests_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(ToolRequestError) as info:
        chat_constraint(body)
    assert info.value.param == param


def test_tool_choice_none_shows_tools_but_parses_nothing() -> None:
    constraint = chat_constraint({"tools": [WEATHER], "tool_choice": "none"})
    assert constraint.tools and constraint.structured_outputs is None
    text = format_tool_call("get_weather", {"city": "Rome"})
    assert assistant_message(text, "stop", constraint) == (
        {"role": "assistant", "content": text},
        "stop",
    )


def test_replies_become_tool_calls_and_deltas() -> None:
    constraint = chat_constraint({"tools": [WEATHER]})
    text = "Checking." + format_tool_call("get_weather", {"city": "Rome"})
    message, finish = assistant_message(text, "stop", constraint)
    assert finish == "tool_calls" and message["content"] == "Checking."
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    deltas = ChatDeltas(constraint)
    out = [d for i in range(0, len(text), 5) for d in deltas.feed(text[i : i + 5])]
    rest, finish = deltas.finish("stop")
    out += rest
    assert "".join(d.get("content", "") for d in out) == "Checking."
    calls = [d["tool_calls"][0] for d in out if "tool_calls" in d]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather")]
    assert finish == "tool_calls"
    plain = ChatDeltas(ChatConstraint())
    assert plain.feed("<tool_call>") == [{"content": "<tool_call>"}]


def test_a_required_call_through_the_engine_is_a_valid_tool_call() -> None:
    from eclectus.server.engine import EngineConfig, LLMEngine

    engine = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=128))
    body = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    constraint = chat_constraint(body)
    prompt = render_chat(
        None, [{"role": "user", "content": "Weather in Oslo?"}], tools=constraint.tools
    )
    sampling = with_constraint(SamplingParams(max_tokens=80, temperature=0.8, seed=1), constraint)
    engine.add_tokens("r", engine.tokenizer.encode(prompt), sampling)
    text, finish = "", None
    while engine.has_unfinished:
        for out in engine.step():
            text += out.text
            finish = out.finish_reason or finish
    message, finish = assistant_message(text, finish, constraint)
    assert finish == "tool_calls" and message["content"] is None
    (call,) = message["tool_calls"]
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"]
    )


def test_templates_get_the_tools_as_vllm_passes_them() -> None:
    """A template renders the tool objects it is given, so the prompt is vLLM's only if they
    are vLLM's: its dump of each tool keeps ``strict`` when the client sent it (langchain's
    ``bind_tools(strict=True)`` does) and has ``description`` / ``parameters`` null when
    absent, keys in that order."""
    strict = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find.",
            "parameters": {"type": "object", "properties": {"term": {"type": "string"}}},
            "strict": True,
        },
    }
    bare = {"type": "function", "function": {"name": "ping"}}
    tools = chat_constraint({"tools": [strict, bare], "tool_choice": "auto"}).tools
    assert tools[0] == strict
    assert list(tools[0]["function"]) == ["name", "description", "parameters", "strict"]
    assert tools[1] == {
        "type": "function",
        "function": {"name": "ping", "description": None, "parameters": None},
    }


def test_a_reply_read_for_hermes_calls_keeps_special_tokens_text() -> None:
    """vLLM's hermes parser turns ``skip_special_tokens`` off for a request with tools (so
    a reply's ``<|user|>`` stays in its text); the same request here does as well, and one
    without tools keeps vLLM's default."""
    sampling = SamplingParams(max_tokens=8)
    tools = with_constraint(sampling, chat_constraint({"tools": [WEATHER]}))
    assert tools.skip_special_tokens is False
    plain = with_constraint(sampling, chat_constraint({}))
    none = with_constraint(sampling, chat_constraint({"tools": [WEATHER], "tool_choice": "none"}))
    assert plain.skip_special_tokens and none.skip_special_tokens
    # vLLM adjusts any request whose tool_choice is not "none", a response_format beside
    # the tools included (its renderer calls adjust_request; hermes checks only the tools)
    formatted = chat_constraint({"tools": [WEATHER], "response_format": {"type": "json_object"}})
    assert not formatted.parse_tool_calls
    assert with_constraint(sampling, formatted).skip_special_tokens is False
