"""Structured outputs through the SDK and the real server: constrained values are valid by
construction, and ``parse=True`` hands them back parsed."""

from __future__ import annotations

import re

import jsonschema
import pytest
from client_live import LiveServer
from pydantic import BaseModel

from eclectus.adapters.client import Gen, ServerError, VariableFailed, connect
from eclectus.adapters.client.functions import to_sampling

pytestmark = pytest.mark.slow

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "pop": {"type": "integer"}},
    "required": ["city", "pop"],
}


class Point(BaseModel):
    x: int
    y: int


def test_shorthands_become_vllms_structured_outputs() -> None:
    """``json_schema=`` (a dict or a Pydantic class), ``regex=``, ``choice=`` set one
    constraint; two at once, or a shorthand beside structured_outputs=, are refused."""
    assert to_sampling({"json_schema": CITY}, "x").structured_outputs.schema_object == CITY
    assert to_sampling({"json_schema": Point}, "x").structured_outputs.kind == "json"
    assert Gen(choice=["a", "b"]).sampling.structured_outputs.choice == ("a", "b")
    with pytest.raises(ValueError, match="exactly one of"):
        Gen(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="not both"):
        to_sampling({"regex": "a", "structured_outputs": {"regex": "b"}}, "x")


async def test_constrained_outputs_arrive_valid_and_parsed(live_server: LiveServer) -> None:
    async with connect(live_server.url, token=live_server.token) as app:
        city, code, pick = app.call(
            [
                "A city as JSON: ",
                Gen(max_tokens=40, json_schema=CITY),
                "\nA code: ",
                Gen(max_tokens=12, regex=r"[A-Z]{3}-\d{3}"),
                "\nYes or no: ",
                Gen(max_tokens=4, choice=["yes", "no"]),
            ]
        )
        point = app.function("Point: {{p}}", p=dict(max_tokens=30, json_schema=Point))()
        value = await city.aget(parse=True)
        jsonschema.validate(value, CITY)
        assert re.fullmatch(r"[A-Z]{3}-\d{3}", await code.aget())
        assert await pick.aget(parse=True) in ("yes", "no")
        assert Point.model_validate(await point.aget(parse=True))
        assert city.constraint is not None and city.constraint.kind == "json"


async def test_a_budget_too_small_for_the_schema_fails_the_call(live_server: LiveServer) -> None:
    async with connect(live_server.url, token=live_server.token) as app:
        (city,) = app.call(["City: ", Gen(max_tokens=3, json_schema=CITY)])
        with pytest.raises((VariableFailed, ServerError), match="cannot hold"):
            await city.aget()
