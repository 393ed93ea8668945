"""Structured output for the completion model ``EclectusLLM``.

LangChain defines ``with_structured_output`` on ``BaseLanguageModel`` but raises
NotImplementedError for completion models (``BaseLLM``): a text-in, text-out model has no
tools or response format to bind. Eclectus constrains the generated text itself
(``SamplingParams.structured_outputs``), so a completion model can promise a schema too: the
reply is one JSON value valid against the schema, by construction, then parsed.

Methods, as ChatEclectus names them: ``json_schema`` (held to the schema) and ``json_mode``
(held to the schema when one is given, else any JSON object). ``function_calling`` needs a
chat model's tools and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_json_schema

from eclectus.adapters.langchain.structured_parse import ls_format, parsed_runnable, text_parser
from eclectus.protocol.structured import StructuredOutputs

LLM_STRUCTURED_METHODS = ("json_schema", "json_mode")


def completion_constraint(schema: Any, method: str) -> StructuredOutputs:
    """The constraint of ``with_structured_output(schema, method=...)`` on a completion
    model (pure). ``schema``: a Pydantic class, a TypedDict or a JSON Schema dict (what
    LangChain's ``convert_to_json_schema`` accepts), or None with ``json_mode``. Raises
    ValueError for an unknown method or a missing schema."""
    if method not in LLM_STRUCTURED_METHODS:
        raise ValueError(
            f"EclectusLLM.with_structured_output: method is 'json_schema' or 'json_mode', not "
            f"{method!r} (function calling needs a chat model: use ChatEclectus)"
        )
    if schema is None:
        if method == "json_schema":
            raise ValueError("method='json_schema' needs a schema")
        return StructuredOutputs(json_object=True)
    return StructuredOutputs(json=convert_to_json_schema(schema))


def completion_structured_runnable(
    bind: Callable[..., Runnable], schema: Any, method: str, include_raw: bool
) -> Runnable:
    """The bound completion model and its parser (pure): a Pydantic class parses to its
    instance, anything else to a dict. ``include_raw``: a dict with ``raw`` (the text),
    ``parsed`` and ``parsing_error``."""
    constraint = completion_constraint(schema, method)
    llm = bind(structured_outputs=constraint, ls_structured_output_format=ls_format(schema, method))
    return parsed_runnable(llm, text_parser(schema), include_raw)
