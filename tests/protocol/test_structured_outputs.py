"""StructuredOutputs: vLLM's names, exactly one constraint, each validated at the edge."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from eclectus.protocol import GenSegment, SamplingParams, StructuredOutputs

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_a_schema_object_and_its_text_are_one_constraint() -> None:
    """A schema given as an object or as text compares, hashes and keys the same."""
    as_dict = StructuredOutputs(json=SCHEMA)
    as_text = StructuredOutputs.model_validate({"json": json.dumps(SCHEMA, indent=2)})
    assert as_dict == as_text and hash(as_dict) == hash(as_text)
    assert as_dict.key == as_text.key and as_dict.kind == "json"
    assert as_dict.schema_object == SCHEMA


def test_the_wire_name_is_vllms() -> None:
    """It serialises as ``json`` (vLLM's field), through SamplingParams and a gen segment."""
    seg = GenSegment(gen="v1", sampling=SamplingParams(structured_outputs={"json": SCHEMA}))
    body = seg.model_dump(mode="json", exclude_defaults=True)
    assert json.loads(body["sampling"]["structured_outputs"]["json"]) == SCHEMA
    assert GenSegment.model_validate(body) == seg


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of"),
        ({"regex": "a", "choice": ["a"]}, "exactly one of"),
        ({"json": "[1, 2]"}, "a JSON Schema is a JSON object"),
        ({"json": "{nope"}, "not valid JSON"),
        ({"regex": "(unclosed"}, "does not compile"),
        ({"choice": "yes"}, "a list of strings"),
        ({"choice": []}, "at least 1"),
        ({"choice": ["a", ""]}, "must not be empty"),
        ({"grammar": "  "}, "grammar: empty"),
        ({"json_object": False}, "only true"),
        ({"regex": "a", "colour": 1}, "Extra inputs"),
    ],
)
def test_bad_constraints_are_refused_by_name(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SamplingParams(structured_outputs=fields)


def test_each_kind_names_itself() -> None:
    kinds = [
        StructuredOutputs(json_object=True),
        StructuredOutputs(regex=r"\d+"),
        StructuredOutputs(choice=["x", "y"]),
        StructuredOutputs(grammar='root ::= "a"'),
    ]
    assert [k.kind for k in kinds] == ["json_object", "regex", "choice", "grammar"]
    assert len({k.key for k in kinds}) == 4
