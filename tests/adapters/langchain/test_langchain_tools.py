"""ChatEclectus tools and structured output against the real server (tiny model): the
mechanics hold whatever the model chooses, because the grammar enforces them."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from json_fixtures import CASE_IDS, CASES, MAX_FREE_WHITESPACE, longest_free_whitespace
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field
from tool_fixtures import MARKERS, PINNED_WEATHER

from eclectus.adapters.langchain import ChatEclectus
from eclectus.adapters.langchain.tools import split_call_kwargs, tool_choice_of

pytestmark = pytest.mark.usefixtures("eclectus_server")


class Weather(BaseModel):
    """Get the weather of a city."""

    city: str = Field(max_length=12)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(x: int, y: int) -> int:
    """Multiply two integers."""
    return x * y


OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 8}},
            "required": ["word"],
        },
    },
}
SCHEMAS = {
    "Weather": Weather.model_json_schema(),
    "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    "multiply": {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    },
    "lookup": OPENAI_TOOL["function"]["parameters"],
}


def model(**kwargs: Any) -> ChatEclectus:
    return ChatEclectus(**{"max_tokens": 128, "temperature": 0.8, "seed": 3, **kwargs})


def check_calls(message: AIMessage, names: set[str]) -> None:
    assert message.tool_calls and message.response_metadata["finish_reason"] == "tool_calls"
    for call in message.tool_calls:
        assert call["name"] in names and call["id"] and call["type"] == "tool_call"
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])


def test_tool_choice_forms_map_to_openais() -> None:
    tools = [OPENAI_TOOL]
    assert tool_choice_of("any", tools) == "required"
    assert tool_choice_of("lookup", tools) == {"type": "function", "function": {"name": "lookup"}}
    assert tool_choice_of(True, tools) == {"type": "function", "function": {"name": "lookup"}}
    with pytest.raises(ValueError, match="exactly one tool"):
        tool_choice_of(True, tools * 2)
    with pytest.raises(ValueError, match="extra_body: 'foo'"):
        split_call_kwargs({"extra_body": {"foo": 1}}, None)


@pytest.mark.parametrize("choice", ["any", "required", "multiply", True])
def test_every_tool_form_gives_valid_forced_calls(choice: object) -> None:
    """OpenAI dicts, LangChain tools, Pydantic classes and functions; forced by the grammar."""
    tools: list[Any] = [OPENAI_TOOL, add, Weather, multiply]
    if choice is True:
        tools = [multiply]
    bound = model().bind_tools(tools, tool_choice=choice)
    message = bound.invoke("Use a tool.")
    names = {"multiply"} if choice in ("multiply", True) else set(SCHEMAS)
    check_calls(message, names)
    assert message.usage_metadata and message.usage_metadata["output_tokens"] > 0


def test_parallel_tool_calls_false_makes_one_call() -> None:
    bound = model(seed=11).bind_tools([add, multiply], tool_choice="any", parallel_tool_calls=False)
    for prompt in ("one", "two", "three"):
        assert len(bound.invoke(prompt).tool_calls) == 1


def test_streamed_tool_call_chunks_add_up_to_the_calls() -> None:
    bound = model().bind_tools([Weather, add], tool_choice="required")
    chunks = list(bound.stream("Weather in Paris?"))
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert full.tool_call_chunks and all(c["index"] is not None for c in full.tool_call_chunks)
    check_calls(
        AIMessage(
            content=full.content,
            tool_calls=full.tool_calls,
            response_metadata=full.response_metadata,
        ),
        set(SCHEMAS),
    )
    assert full.usage_metadata is not None


def test_a_streamed_call_whose_argument_holds_the_closing_tag_is_a_call() -> None:
    """The argument is pinned to a string holding ``</tool_call>`` (and the other formats'
    markers): the streamed chunks add up to the call, as the whole reply does."""
    bound = model().bind_tools([PINNED_WEATHER], tool_choice="get_weather")
    chunks = list(bound.stream("Weather in Oslo?"))
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert [c["args"] for c in full.tool_calls] == [{"city": MARKERS}]
    assert full.content == ""
    assert [c["args"] for c in bound.invoke("Weather in Oslo?").tool_calls] == [{"city": MARKERS}]


async def test_async_stream_and_invoke_match_the_sync_mechanics() -> None:
    bound = model().bind_tools([add], tool_choice="add")
    message = await bound.ainvoke("Add 2 and 3.")
    check_calls(message, {"add"})
    chunks = [c async for c in bound.astream("Add 2 and 3.")]
    assert any(c.tool_call_chunks for c in chunks)


def test_tool_message_round_trip_reaches_the_prompt() -> None:
    """An AIMessage's calls and the ToolMessage answering it are rendered back into the
    prompt (the model sees its own call and the result)."""
    chat = model()
    call = {"name": "add", "args": {"a": 1, "b": 2}, "id": "call_1", "type": "tool_call"}
    history = [
        HumanMessage("add 1 and 2"),
        AIMessage(content="", tool_calls=[call]),
        ToolMessage("3", tool_call_id="call_1"),
    ]
    from eclectus.adapters.langchain.pieces import concrete_text

    prompt = concrete_text(chat.prompt_pieces(history, tools=[OPENAI_TOOL]))
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' in prompt
    assert "<|tool|>\n3\n" in prompt and '"name": "lookup"' in prompt
    reply = chat.bind_tools([add]).invoke(history)
    assert isinstance(reply, AIMessage)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_with_structured_output_returns_the_schema(method: str) -> None:
    structured = model().with_structured_output(Weather, method=method)  # type: ignore[arg-type]
    assert isinstance(structured.invoke("The weather where?"), Weather)
    as_dict = model().with_structured_output(Weather.model_json_schema(), method=method)  # type: ignore[arg-type]
    jsonschema.validate(as_dict.invoke("Weather?"), SCHEMAS["Weather"])


@pytest.mark.parametrize(
    ("temperature", "seed"), [(0.0, None), (1.0, 1)], ids=["greedy", "sampled"]
)
@pytest.mark.parametrize(("schema", "prompt"), CASES, ids=CASE_IDS)
def test_a_json_schema_reply_has_bounded_free_whitespace(
    schema: Any, prompt: str, temperature: float, seed: int | None
) -> None:
    """Free whitespace is bounded by default: between tokens a reply never has more than one
    newline and 32 blanks, greedy or sampled. Whether ``tiny`` closes a free-text string
    before ``max_tokens`` is the model's (greedy without jump-forward, the default, it runs
    the Person's hobbies to the budget; the layouts' stop rates are benchmarks.md's)."""
    chat = ChatEclectus(max_tokens=200, temperature=temperature, seed=seed)
    raw = chat.with_structured_output(schema, method="json_schema", include_raw=True)
    content = raw.invoke(prompt)["raw"].content
    assert longest_free_whitespace(content) <= MAX_FREE_WHITESPACE, content


def test_with_structured_output_include_raw() -> None:
    out = model().with_structured_output(Weather, include_raw=True).invoke("Weather?")
    assert isinstance(out["raw"], AIMessage) and isinstance(out["parsed"], Weather)
    assert out["parsing_error"] is None
    assert Weather.model_validate_json(out["raw"].content) == out["parsed"]


def test_json_mode_without_a_schema_gives_an_object() -> None:
    assert isinstance(model().with_structured_output(None, method="json_mode").invoke("{"), dict)


def test_extra_body_takes_vllms_keys() -> None:
    chat = model(extra_body={"guided_choice": ["yes", "no"], "top_k": 3})
    assert chat.invoke("Yes?").content in ("yes", "no")
    regex = {"structured_outputs": {"regex": "[0-9]{3}"}}
    assert len(model().invoke("Digits:", extra_body=regex).content) == 3
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    text = model().invoke("n?", extra_body={"guided_json": schema}).content
    jsonschema.validate(json.loads(text), schema)


def test_langgraph_react_agent_runs_to_completion() -> None:
    """The prebuilt ReAct agent: the model calls the tool (forced once by the grammar's
    valid arguments), the tool runs, and the agent finishes with an answer."""
    from langgraph.prebuilt import create_react_agent

    calls: list[tuple[int, int]] = []

    @tool
    def add_numbers(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    agent = create_react_agent(model(), [add_numbers])
    result = agent.invoke(
        {"messages": [HumanMessage("What is 2 + 3? Use the tool.")]}, {"recursion_limit": 8}
    )
    messages = result["messages"]
    assert isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls
    for message in messages:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                jsonschema.validate(call["args"], SCHEMAS["add"])
    assert len([m for m in messages if isinstance(m, ToolMessage)]) == len(calls)


def test_the_compiler_cuts_a_model_bound_with_tools() -> None:
    """A tool-bound model in a compiled chain runs on the client (its reply is parsed into
    tool calls there); explain() says so, and the chain still gives valid calls. A structured
    one lowers (its reply is the constrained JSON; the parser runs where it is needed)."""
    from langchain_core.prompts import ChatPromptTemplate

    from eclectus.adapters.langchain import compile

    prompt = ChatPromptTemplate.from_messages([("human", "Weather in {city}?")])
    chain = prompt | model().bind_tools([Weather], tool_choice="Weather")
    compiled = compile(chain)
    check_calls(compiled.invoke({"city": "Oslo"}), {"Weather"})
    assert "bound with tools" in compiled.explain()
    structured = compile(prompt | model().with_structured_output(Weather))
    assert isinstance(structured.invoke({"city": "Oslo"}), Weather)
    assert structured.last_graph is not None and structured.last_graph.cuts == []


def test_a_compiled_tools_parser_chain_equals_the_eager_one() -> None:
    """``model.bind_tools(...) | PydanticToolsParser``: the tool-bound call is a client cut
    and the parser runs over its reply, so the compiled chain returns what the eager one
    does (greedy): the same validated Pydantic calls."""
    from langchain_core.output_parsers.openai_tools import PydanticToolsParser
    from langchain_core.prompts import ChatPromptTemplate

    from eclectus.adapters.langchain import compile

    prompt = ChatPromptTemplate.from_messages([("human", "Weather in {city}?")])
    bound = model(temperature=0).bind_tools([Weather], tool_choice="Weather")
    chain = prompt | bound | PydanticToolsParser(tools=[Weather])
    eager = chain.invoke({"city": "Oslo"})
    compiled = compile(chain).invoke({"city": "Oslo"})
    assert compiled == eager and all(isinstance(w, Weather) for w in eager) and eager
