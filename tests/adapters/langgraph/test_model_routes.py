"""Which Pydantic router models the compiler may switch on (model_routes): the rules alone,
no server. The end-to-end runs are test_langgraph_model_routing.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.output_parsers import PydanticOutputParser
from lg_graphs import PICKS, EnumRoute, Pick
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from eclectus.adapters.langchain.compiler.symbols import SymParsed, rebuild
from eclectus.adapters.langchain.pieces import Ref
from eclectus.adapters.langgraph.model_routes import (
    UnknownField,
    field_literals,
    field_value,
    known_model,
    routed_field,
    split_model,
)


def parsed(cls: type[BaseModel], *path: str) -> SymParsed:
    """``cls``'s parser over a reply constrained to its schema (the variable is a stand-in)."""
    parser = PydanticOutputParser(pydantic_object=cls)
    return SymParsed(Ref(object()), parser, cls.model_json_schema(), path)


class Route(BaseModel):
    next: Literal["research", "write", "FINISH"]
    why: str


class ValueRoute(BaseModel):
    model_config = ConfigDict(use_enum_values=True)
    next: Pick


def test_a_literal_or_enum_field_is_routed() -> None:
    assert field_literals(parsed(Route, "next")) == PICKS
    assert field_literals(parsed(EnumRoute, "next")) == PICKS
    assert field_literals(parsed(Route, "why")) is None  # a str
    assert routed_field(parsed(Route)) is not None
    assert routed_field(parsed(Route)).path == ("next",)  # type: ignore[union-attr]


def test_the_known_value_is_what_the_parser_returns() -> None:
    """The edge sees, ahead of time, the value the parsed model will hold."""
    for cls in (Route, EnumRoute, ValueRoute):
        for literal in PICKS:
            field = parsed(cls, "next")
            text = f'{{"next": "{literal}", "why": "x"}}'
            eager = PydanticOutputParser(pydantic_object=cls).parse(text).next
            known = field_value(field, literal)
            assert known == eager and type(known) is type(eager)
            assert rebuild(field, {id(field.ref): text}) == eager


class Validated(BaseModel):
    next: Literal["research", "write", "FINISH"]

    @field_validator("next")
    @classmethod
    def same(cls, value: str) -> str:
        return value


class WithDefault(BaseModel):
    next: Literal["research", "write", "FINISH"] = "FINISH"


class Aliased(BaseModel):
    next: Literal["research", "write", "FINISH"] = Field(alias="goto")


class Lowered(BaseModel):
    model_config = ConfigDict(str_to_lower=True)
    next: Literal["research", "write", "FINISH"]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True)
    next: Pick


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    next: Literal["research", "write", "FINISH"]


class WithMetadata(BaseModel):
    next: Annotated[Literal["research", "write", "FINISH"], AfterValidator(lambda v: v)]


class PostInit(BaseModel):
    next: Literal["research", "write", "FINISH"]

    def model_post_init(self, context: Any) -> None:
        pass


REFUSED = [Validated, WithDefault, Aliased, Lowered, Strict, Extra, WithMetadata, PostInit]


@pytest.mark.parametrize("cls", REFUSED, ids=lambda c: c.__name__)
def test_a_model_whose_parse_may_change_the_field_is_not_routed(cls: type[BaseModel]) -> None:
    assert field_literals(parsed(cls, "next")) is None
    assert routed_field(parsed(cls)) is None


def test_split_writes_the_fields_naming_channels() -> None:
    """As LangGraph's ``get_update_as_tuples``: each field naming a channel; none when a
    field has a default or a channel names another attribute of the model."""
    split = split_model(parsed(Route), {"next": None, "task": None})
    assert split is not None and list(split) == ["next"] and split["next"].path == ("next",)
    assert split_model(parsed(WithDefault), {"next": None}) is None
    assert split_model(parsed(Route), {"next": None, "copy": None}) is None


@given(st.sampled_from(PICKS), st.sampled_from([Route, EnumRoute]))
def test_a_known_model_holds_the_field_and_raises_on_the_rest(literal: str, cls: Any) -> None:
    model = known_model(parsed(cls, "next"), literal)
    assert isinstance(model, cls) and model.next == literal
    for peek in (
        lambda: model.why,
        lambda: getattr(model, "why", "a default"),
        lambda: model == cls.model_construct(next=literal),
        lambda: repr(model),
        lambda: f"{model}",
        lambda: model.model_dump(),
        lambda: dict(model),
    ):
        with pytest.raises(UnknownField):
            peek()
