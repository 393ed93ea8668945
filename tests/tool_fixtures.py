"""The tool definitions and the question the tool-calling tests share (a uniquely named module
at the tests root: tests/conftest.py puts this folder on sys.path, so every suite imports it
as ``tool_fixtures``)."""

from __future__ import annotations

from typing import Any

DEFAULT_WEATHER_DESCRIPTION = "The weather in a city."


def weather_tool(
    description: str | None = DEFAULT_WEATHER_DESCRIPTION, max_city_length: int | None = None
) -> dict[str, Any]:
    """An OpenAI ``get_weather`` tool taking one required string ``city`` (pure).
    ``description``: None leaves the field out; ``max_city_length`` bounds the city's length
    (so a constrained call closes within a few tokens)."""
    city: dict[str, Any] = {"type": "string"}
    if max_city_length is not None:
        city["maxLength"] = max_city_length
    function: dict[str, Any] = {"name": "get_weather"}
    if description is not None:
        function["description"] = description
    function["parameters"] = {
        "type": "object",
        "properties": {"city": city},
        "required": ["city"],
    }
    return {"type": "function", "function": function}


WEATHER = weather_tool()
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Lisbon?"}]

# Every format's call markers, and JSON's own, inside one string: a call whose argument is
# pinned to it (an enum of one) must still parse, whole and streamed, in every format.
MARKERS = '</tool_call> <tool_call> [TOOL_CALLS] <|python_tag|> "}]; {[ \\ end'
PINNED_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": DEFAULT_WEATHER_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": [MARKERS]}},
            "required": ["city"],
        },
    },
}
