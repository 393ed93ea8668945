"""Eclectus structured output against the real server (tiny model): structured_predict and
as_structured_llm give a valid object every time, because the server's grammar holds the
output to the class's JSON Schema."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.program.function_program import get_function_tool
from llama_index.core.program.utils import FlexibleModel
from llama_index.core.prompts import ChatPromptTemplate, PromptTemplate
from llama_index.core.types import PydanticProgramMode
from pydantic import BaseModel, Field

from eclectus.adapters.llamaindex import Eclectus
from eclectus.adapters.llamaindex.structured import (
    JsonSchemaProgram,
    PartialObjects,
    json_constraint,
)
from eclectus.server.front.app import EclectusServer

PROMPT = PromptTemplate("Name a city near {place}.")
CHAT_PROMPT = ChatPromptTemplate.from_messages(
    [("system", "Answer in JSON."), ("user", "Name a city near {place}.")]
)


class Size(StrEnum):
    SMALL = "small"
    LARGE = "large"


class City(BaseModel):
    """A city."""

    name: str = Field(max_length=12)
    rank: int = Field(ge=1, le=50)


class Trip(BaseModel):
    """Nested objects, a list, an enum and an optional field."""

    start: City
    stops: list[str] = Field(max_length=3)
    size: Size
    note: str | None = Field(default=None, max_length=10)


@pytest.fixture
def sampled(server: EclectusServer) -> Iterator[Eclectus]:
    model = Eclectus(url=server.url, max_tokens=160, temperature=0.9, seed=11, app="li-struct")
    yield model
    model.close()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("cls", [City, Trip])
def test_structured_predict_validates_every_time(
    sampled: Eclectus, cls: type[BaseModel], seed: int
) -> None:
    """Sampled at a high temperature, several seeds: every output is an instance."""
    out = sampled.structured_predict(cls, PROMPT, llm_kwargs={"seed": seed}, place="the sea")
    assert isinstance(out, cls)


def test_chat_prompt_template(sampled: Eclectus) -> None:
    assert isinstance(sampled.structured_predict(City, CHAT_PROMPT, place="hills"), City)


async def test_astructured_predict(sampled: Eclectus) -> None:
    assert isinstance(await sampled.astructured_predict(Trip, PROMPT, place="the sea"), Trip)
    out = await sampled.astructured_predict(City, CHAT_PROMPT, place="hills")
    assert isinstance(out, City)


@pytest.mark.parametrize("prompt", [PROMPT, CHAT_PROMPT], ids=["template", "chat"])
def test_stream_structured_predict_ends_with_the_object(sampled: Eclectus, prompt: Any) -> None:
    """Partial objects (fields filled as they arrive), then the whole object, equal to the
    non-streamed one (same seed)."""
    outs = list(sampled.stream_structured_predict(City, prompt, place="the sea"))
    assert isinstance(outs[-1], City) and len(outs) > 1
    assert all(isinstance(o, FlexibleModel) for o in outs[:-1])
    assert outs[-1] == sampled.structured_predict(City, prompt, place="the sea")


async def test_astream_structured_predict(sampled: Eclectus) -> None:
    stream = await sampled.astream_structured_predict(City, PROMPT, place="the sea")
    outs = [o async for o in stream]
    assert isinstance(outs[-1], City)


def test_as_structured_llm(sampled: Eclectus) -> None:
    """StructuredLLM's chat runs the constrained program: raw is the object, the content
    its JSON."""
    structured = sampled.as_structured_llm(Trip)
    response = structured.chat([ChatMessage(role=MessageRole.USER, content="Plan a trip.")])
    assert isinstance(response.raw, Trip)
    assert Trip.model_validate_json(response.message.content or "") == response.raw
    assert isinstance(structured.complete("Plan a trip.").raw, Trip)


def test_partial_objects_reads_growing_json() -> None:
    partials = PartialObjects(City)
    seen = [
        p for chunk in ['{"na', 'me": "Ro', 'me", "ra', "nk", '": 3}'] for p in partials.feed(chunk)
    ]
    assert seen[-1].model_dump() == {"name": "Rome", "rank": 3}
    assert partials.finish() == City(name="Rome", rank=3)


@settings(max_examples=100, deadline=None)  # timings vary on a shared CPU
@given(
    name=st.text(max_size=12),
    rank=st.integers(min_value=1, max_value=50),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8),
)
def test_partial_objects_any_chunking(name: str, rank: int, cuts: list[int]) -> None:
    """However the JSON is cut into deltas, every partial holds only fields of the class
    with values the whole object has or prefixes of them, and finish gives the object."""
    city = City(name=name, rank=rank)
    text = city.model_dump_json()
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    partials = PartialObjects(City)
    seen = [p for a, b in itertools.pairwise(bounds) for p in partials.feed(text[a:b])]
    for partial in seen:
        data = partial.model_dump(exclude_none=True)
        assert set(data) <= {"name", "rank"}
        assert data.get("name", "") == name[: len(data.get("name", ""))]
    assert partials.finish() == city


@pytest.mark.parametrize("seed", [1, 2])
def test_llamaindexs_function_program_validates_too(server: EclectusServer, seed: int) -> None:
    """pydantic_program_mode=FUNCTION: LlamaIndex's FunctionCallingProgram forces a call of
    the class as a tool (tool_required), which the grammar holds to its schema."""
    llm = Eclectus(
        url=server.url,
        max_tokens=160,
        temperature=0.9,
        seed=seed,
        pydantic_program_mode=PydanticProgramMode.FUNCTION,
    )
    assert isinstance(llm.structured_predict(Trip, PROMPT, place="the sea"), Trip)


def test_the_constraint_costs_fewer_tokens_than_a_forced_tool_call(
    server: EclectusServer,
) -> None:
    """The same question, answered as the JSON-schema program asks (the constraint only)
    and as LlamaIndex's FunctionCallingProgram asks (the class as a forced tool): the tools
    preamble and the call's wrapper cost prompt and completion tokens the constraint does
    not. Counts from the server (docs/llamaindex.md, "Structured output")."""
    llm = Eclectus(url=server.url, max_tokens=64)
    messages = [ChatMessage(role=MessageRole.USER, content="Name a city near the sea.")]
    direct = llm.chat(messages, structured_outputs=json_constraint(City)).additional_kwargs
    tool = get_function_tool(City)
    forced = llm.chat_with_tools([tool], chat_history=messages, tool_required=True)
    via_tool = forced.additional_kwargs
    print(
        f"prompt/completion tokens: constraint {direct['prompt_tokens']}/"
        f"{direct['completion_tokens']}, forced tool call {via_tool['prompt_tokens']}/"
        f"{via_tool['completion_tokens']}"
    )
    assert direct["prompt_tokens"] < via_tool["prompt_tokens"]
    assert direct["completion_tokens"] < via_tool["completion_tokens"]


def test_other_program_modes_use_llamaindexs_programs(server: EclectusServer) -> None:
    """The constrained program is the default; another pydantic_program_mode opts out."""
    default = Eclectus(url=server.url)
    assert isinstance(default._program(City, PROMPT), JsonSchemaProgram)
    plain = Eclectus(url=server.url, pydantic_program_mode=PydanticProgramMode.LLM)
    assert plain._program(City, PROMPT) is None
