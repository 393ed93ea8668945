"""Each tool-call format end to end on the real tiny engine: a prompt rendered with a
Llama-3-style or Mistral-style chat template, decoded under the format's constraint, reads
back in that format as well-formed calls of declared tools (differential: the grammar and
the parser agree)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tool_fixtures import ADD_TOOL, weather_tool

from eclectus.protocol import SamplingParams
from eclectus.protocol.chat_template import render_chat
from eclectus.protocol.tool_formats import detect_tool_format, tool_format
from eclectus.protocol.tools import tool_specs
from eclectus.server.engine import EngineConfig, LLMEngine

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"
TOOLS = [weather_tool(description=None, max_city_length=12), ADD_TOOL]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TRIGGERS = {"llama3_json": '{"name": ', "mistral": "[TOOL_CALLS]"}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    # with the opt-in budget guarantee: every forced call must parse at these budgets
    return LLMEngine(EngineConfig(model="tiny", num_kv_blocks=512, budget_guarantee=True))


def generate(engine: LLMEngine, prompt: str, requests: list[SamplingParams]) -> list[str]:
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    for i, sampling in enumerate(requests):
        engine.add_tokens(f"t{i}", ids, sampling)
    texts = [""] * len(requests)
    while engine.has_unfinished:
        for out in engine.step():
            texts[int(out.request_id[1:])] += out.text
    return texts


def prompt_for(template_name: str) -> tuple[str, str]:
    """The rendered prompt of a weather question and the format its template teaches."""
    template = (TEMPLATES / template_name).read_text()
    messages = [{"role": "user", "content": "What is the weather in Lisbon?"}]
    prompt = render_chat(
        template, messages, template_vars={"bos_token": "", "eos_token": ""}, tools=TOOLS
    )
    return prompt, detect_tool_format(template)


@pytest.mark.parametrize("template_name", ["llama3_json.jinja", "mistral.jinja"])
@pytest.mark.parametrize(
    ("choice", "parallel"),
    [("required", True), ("required", False), ({"function": {"name": "add"}}, True)],
)
def test_forced_calls_decode_in_the_templates_format_and_parse_back(
    engine: LLMEngine, template_name: str, choice: Any, parallel: bool
) -> None:
    """required / named: every output, greedy or sampled, is only calls of that format."""
    prompt, name = prompt_for(template_name)
    fmt = tool_format(name)
    constraint = fmt.constraint(tool_specs(TOOLS), choice, parallel)
    requests = [
        SamplingParams(max_tokens=160, temperature=t, seed=s, structured_outputs=constraint)
        for t, s in ((0.0, None), (1.0, 1), (1.0, 2))
    ]
    for text in generate(engine, prompt, requests):
        content, calls = fmt.parse(text)
        assert content == "" and calls, text
        assert len(calls) == 1 or parallel
        for call in calls:
            assert call.name in SCHEMAS and (call.name == "add" or "name" not in choice)
            jsonschema.validate(call.arguments, SCHEMAS[call.name])
        if name == "mistral":
            assert text.startswith("[TOOL_CALLS][")
        else:
            assert json.loads(text.split(";")[0])["name"] == calls[0].name


@pytest.mark.parametrize("template_name", ["llama3_json.jinja", "mistral.jinja"])
def test_auto_gives_text_or_well_formed_calls_never_a_malformed_one(
    engine: LLMEngine, template_name: str
) -> None:
    """auto: once the format's call marker is written, the call completes well-formed."""
    prompt, name = prompt_for(template_name)
    fmt = tool_format(name)
    constraint = fmt.constraint(tool_specs(TOOLS), "auto", True)
    requests = [
        SamplingParams(max_tokens=96, temperature=1.2, seed=s, structured_outputs=constraint)
        for s in range(6)
    ]
    for text in generate(engine, prompt, requests):
        _, calls = fmt.parse(text)
        # every marker the output wrote opened a call that completed and parses
        assert text.count(TRIGGERS[name]) <= len(calls), text
        for call in calls:
            jsonschema.validate(call.arguments, SCHEMAS[call.name])


def test_a_template_turn_of_decoded_calls_renders_and_parses_again(engine: LLMEngine) -> None:
    """Round trip: decoded calls, rendered back as the assistant turn by the template, read
    back as the same calls."""
    template = (TEMPLATES / "llama3_json.jinja").read_text()
    prompt, name = prompt_for("llama3_json.jinja")
    fmt = tool_format(name)
    constraint = fmt.constraint(tool_specs(TOOLS), "required", True)
    (text,) = generate(
        engine, prompt, [SamplingParams(max_tokens=160, structured_outputs=constraint)]
    )
    _, calls = fmt.parse(text)
    messages = [
        {"role": "user", "content": "What is the weather in Lisbon?"},
        {"role": "assistant", "content": None, "tool_calls": [c.openai() for c in calls]},
    ]
    rendered = render_chat(
        template, messages, add_generation_prompt=False, template_vars={"bos_token": ""}
    )
    turn = rendered.rsplit("<|end_header_id|>\n\n", 1)[1].removesuffix("<|eom_id|>")
    _, again = fmt.parse(turn)
    assert [(c.name, c.arguments) for c in again] == [(c.name, c.arguments) for c in calls]


WELL_FORMED = {
    "llama3_json": [
        "It is sunny.",
        '{"name": "add", "parameters": {"a": 1, "b": 2}}',
        '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "get_weather", '
        '"parameters": {"city": "Oslo"}}',
    ],
    "mistral": [
        "It is sunny.",
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',
        'Checking. [TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
    ],
}
MALFORMED = {
    "llama3_json": [
        '{"name": "nope", "parameters": {}}',  # not a declared tool
        '{"name": "add", "parameters": {"a": "one", "b": 2}}',  # arguments off the schema
        '{"name": "add", "arguments": {"a": 1, "b": 2}}',  # not this format's key
        '{"name":"add", "parameters": {"a": 1, "b": 2}}',  # off the call's spelling
        'The answer is {"answer": 42}',  # a JSON object that is not a call
    ],
    "mistral": [
        "[TOOL_CALLS] sorry",
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]',  # a required argument missing
        '[TOOL_CALLS]{"name": "add", "arguments": {"a": 1, "b": 2}}',  # no array
    ],
}


@pytest.mark.parametrize("name", ["llama3_json", "mistral"])
def test_auto_admits_text_and_well_formed_calls_and_refuses_malformed_ones(
    engine: LLMEngine, name: str
) -> None:
    """The auto grammar, checked string by string on the engine's matcher: what it admits
    parses as calls in its format; a malformed call is refused before it completes."""
    import xgrammar as xgr

    fmt = tool_format(name)
    constraint = fmt.constraint(tool_specs(TOOLS), "auto", True)
    assert constraint is not None
    compiled = engine.grammar_backend.compile(constraint)

    def admits(text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiled)
        return matcher.accept_string(text) and matcher.is_completed()

    for text in WELL_FORMED[name]:
        assert admits(text), text
        assert len(fmt.parse(text)[1]) == text.count('"name": ')
    for text in MALFORMED[name]:
        assert not admits(text), text


_leaf = st.one_of(
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.lists(st.sampled_from(["a", "b c", "é", '"q"']), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
    st.just({"type": "array", "items": {"type": "integer"}, "maxItems": 2}),
)
_parameters = st.dictionaries(
    st.sampled_from(["city", "n", "flag", "tags", "kind"]), _leaf, min_size=0, max_size=3
).map(lambda props: {"type": "object", "properties": props, "required": sorted(props)})


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parameters=st.lists(_parameters, min_size=1, max_size=2), seed=st.integers(0, 99))
def test_random_tool_schemas_decode_to_calls_that_parse_and_validate(
    engine: LLMEngine, name: str, parameters: list[dict[str, Any]], seed: int
) -> None:
    """Differential over random tools: whatever the constrained engine writes under
    ``required``, greedy and sampled, the same format's parser reads as valid calls."""
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": p}}
        for i, p in enumerate(parameters)
    ]
    fmt = tool_format(name)
    constraint = fmt.constraint(tool_specs(tools), "required", True)
    requests = [
        SamplingParams(max_tokens=96, structured_outputs=constraint),
        SamplingParams(max_tokens=96, temperature=1.0, seed=seed, structured_outputs=constraint),
    ]
    for text in generate(engine, "Call a tool:", requests):
        content, calls = fmt.parse(text)
        assert content == "" and calls, text
        for call in calls:
            jsonschema.validate(call.arguments, parameters[int(call.name.split("_")[1])])


def test_a_second_call_is_opened_only_when_it_still_fits_the_budget(engine: LLMEngine) -> None:
    """Regression: after a complete call the closing path is one token (``]``), and the
    budget check's window (twice that plus a margin) was too small to catch the ``,`` that
    opens another call, whose own closing path is a whole call (~35 tokens): sampled runs
    ended mid-call at ``max_tokens``. Every sampled run under a tight budget now parses."""
    parameters = {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "maxLength": 1},
            "flag": {"type": "boolean"},
            "city": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
        },
        "required": ["city", "flag", "kind"],
    }
    tools = [{"type": "function", "function": {"name": "tool_0", "parameters": parameters}}]
    fmt = tool_format("mistral")
    constraint = fmt.constraint(tool_specs(tools), "required", True)
    requests = [
        SamplingParams(max_tokens=96, temperature=1.0, seed=seed, structured_outputs=constraint)
        for seed in range(48)
    ]
    for text in generate(engine, "Call a tool:", requests):
        content, calls = fmt.parse(text)
        assert content == "" and calls, text
        for call in calls:
            jsonschema.validate(call.arguments, parameters)
