"""How ``with_structured_output`` parses a reply, for the chat model (tools.py) and the
completion model (llm_structured.py) alike: which parser a schema gets, and the
``include_raw`` wrapping LangChain's own models build."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.pydantic import is_basemodel_subclass


def is_pydantic_class(schema: Any) -> bool:
    """Whether ``schema`` is a Pydantic model class (pure): its replies parse to instances."""
    return isinstance(schema, type) and is_basemodel_subclass(schema)


def text_parser(schema: Any) -> Runnable:
    """The parser of a reply's JSON text (pure): a Pydantic class parses to its instance,
    anything else (a TypedDict, a JSON Schema dict, None) to a dict."""
    if is_pydantic_class(schema):
        return PydanticOutputParser(pydantic_object=schema)
    return JsonOutputParser()


def ls_format(schema: Any, method: str) -> dict[str, Any]:
    """The ``ls_structured_output_format`` a structured model is bound with, for LangSmith
    (pure)."""
    return {"kwargs": {"method": method}, "schema": schema}


def parsed_runnable(llm: Runnable, parser: Runnable, include_raw: bool) -> Runnable:
    """``llm | parser`` (pure); with ``include_raw``, a dict with ``raw`` (the model's
    reply), ``parsed`` and ``parsing_error`` (the exception; ``parsed`` None) instead."""
    if not include_raw:
        return llm | parser
    assign = RunnablePassthrough.assign(
        parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
    )
    none = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | assign.with_fallbacks([none], exception_key="parsing_error")
