"""EclectusLLM (the completion model) with structured output, against the real server (tiny
model): the grammar makes every reply valid whatever the model would choose."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from json_fixtures import City, Colour
from langchain_core.prompts import PromptTemplate

from eclectus.adapters.langchain import EclectusLLM, compile
from eclectus.adapters.langchain.llm_structured import completion_constraint

pytestmark = pytest.mark.usefixtures("eclectus_server")


SCHEMA: dict[str, Any] = {
    "title": "Answer",
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
}


def llm(**kwargs: Any) -> EclectusLLM:
    return EclectusLLM(**{"max_tokens": 96, "temperature": 0.8, "seed": 5, **kwargs})


def test_constraint_of_each_schema_form() -> None:
    """A Pydantic class, a TypedDict and a schema dict all become a JSON-schema constraint;
    json_mode without a schema is any object; unknown methods and a missing schema fail."""
    city = completion_constraint(City, "json_schema").schema_object
    assert city is not None and city["required"] == ["name", "rank"]
    assert city["properties"]["rank"]["maximum"] == 99
    typed = completion_constraint(Colour, "json_mode").schema_object
    assert typed is not None and set(typed["properties"]) == {"colour", "bright"}
    assert completion_constraint(SCHEMA, "json_schema").schema_object == SCHEMA
    assert completion_constraint(None, "json_mode").json_object is True
    with pytest.raises(ValueError, match="function calling needs a chat model"):
        completion_constraint(City, "function_calling")
    with pytest.raises(ValueError, match="needs a schema"):
        completion_constraint(None, "json_schema")


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_pydantic_schema_gives_an_instance(method: str) -> None:
    """The completion is held to the schema, so it parses to the class every time."""
    structured = llm().with_structured_output(City, method=method)
    for seed in (1, 2, 3):
        assert isinstance(structured.invoke("A city:", seed=seed), City)


def test_typeddict_and_dict_schemas_give_valid_dicts() -> None:
    out = llm().with_structured_output(Colour).invoke("A colour:")
    assert isinstance(out, dict) and isinstance(out["bright"], bool)
    answer = llm().with_structured_output(SCHEMA).invoke("Is it so?")
    jsonschema.validate(answer, SCHEMA)


def test_json_mode_without_a_schema_gives_an_object() -> None:
    assert isinstance(llm().with_structured_output(None, method="json_mode").invoke("{"), dict)


def test_include_raw_keeps_the_text() -> None:
    out = llm().with_structured_output(City, include_raw=True).invoke("A city:")
    assert out["parsing_error"] is None and isinstance(out["parsed"], City)
    assert City.model_validate_json(out["raw"]) == out["parsed"]


def test_in_a_chain_batch_and_async() -> None:
    """Prompt | structured model: batch and ainvoke give instances too."""
    chain = PromptTemplate.from_template(
        "Name a city near {place}:"
    ) | llm().with_structured_output(City)
    outs = chain.batch([{"place": "the sea"}, {"place": "the hills"}])
    assert all(isinstance(o, City) for o in outs)


def test_compiled_chain_matches_the_eager_one() -> None:
    """The compiler runs the bound model on the server; the parser runs where its value is
    needed (here, on the client at the end); the result is the eager chain's."""
    prompt = PromptTemplate.from_template("Name a city near {place}:")
    chain = prompt | llm(temperature=0).with_structured_output(City)
    compiled = compile(chain)
    assert compiled.invoke({"place": "the sea"}) == chain.invoke({"place": "the sea"})
    assert "PydanticOutputParser (runs where the value is needed)" in compiled.explain()


async def test_ainvoke_and_astream() -> None:
    structured = llm().with_structured_output(SCHEMA)
    jsonschema.validate(await structured.ainvoke("Yes or no?"), SCHEMA)
    chunks = [c async for c in structured.astream("Yes or no?")]
    jsonschema.validate(chunks[-1], SCHEMA)


def test_the_constraint_reaches_the_raw_completion() -> None:
    """Bound by hand, as the runnable does: the text itself is the JSON."""
    constraint = completion_constraint(SCHEMA, "json_schema")
    text = llm().bind(structured_outputs=constraint).invoke("Answer:")
    jsonschema.validate(json.loads(text), SCHEMA)


def test_unknown_keyword_is_refused() -> None:
    with pytest.raises(ValueError, match="strict"):
        llm().with_structured_output(City, strict=True)
