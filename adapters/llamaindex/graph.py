"""What the graph synthesizers share: when they can build a graph, and how they finish.

A graph synthesizer plans calls with :meth:`Eclectus.template_call` (nothing waits), fetches
the values it must check in one get, and ends with either a known text or the output
variable of the last call, which :func:`afinish`/:func:`finish` fetch or stream the way the
stock synthesizer returns its answer (a string, or a token generator when streaming).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Sequence
from typing import Any

from llama_index.core.response_synthesizers.base import BaseSynthesizer

from eclectus.adapters.client import SemanticVariable
from eclectus.adapters.llamaindex.llm import Eclectus

# The outcome of planning: the answer's text, or the variable whose value is the answer.
Outcome = str | SemanticVariable


def graph_ready(synth: BaseSynthesizer) -> bool:
    """Whether ``synth`` can run as one graph: an Eclectus LLM, plain text in and out.
    Structured outputs, output parsers and multimodal chunks need the LLM's answer on the
    client between calls, so those synthesizers fall back to the stock code path."""
    llm = synth._llm
    return (
        isinstance(llm, Eclectus)
        and llm.output_parser is None
        and synth._output_cls is None
        and not synth._multimodal
        and not llm.metadata.is_chat_model
    )


async def fetch_texts(llm: Eclectus, variables: Sequence[SemanticVariable]) -> list[str]:
    """The values of ``variables``, asked for in one get (mutates: activates their calls)."""
    if not variables:
        return []
    return await llm.aget_many(variables)


# The token streams are generator functions, not the SDK's iterators as they are: LlamaIndex
# picks its response type with isinstance(..., Generator / AsyncGenerator).


async def _astream_tokens(llm: Eclectus, var: SemanticVariable) -> AsyncGenerator[str, None]:
    async for delta in llm.caller.adeltas(var):
        yield delta


def _stream_tokens(llm: Eclectus, var: SemanticVariable) -> Generator[str, None, None]:
    yield from llm.caller.iterate(llm.caller.adeltas(var))


async def afinish(llm: Eclectus, outcome: Outcome, streaming: bool) -> Any:
    """The stock synthesizer's return value for ``outcome``: its text, or an async token
    generator when streaming (mutates: gets or streams the variable)."""
    if isinstance(outcome, str):
        return outcome
    if streaming:
        return _astream_tokens(llm, outcome)
    (text,) = await llm.caller.aget([outcome])
    return text


def finish(llm: Eclectus, outcome: Outcome, streaming: bool) -> Any:
    """Like :func:`afinish` for the sync API: a text, or a sync token generator."""
    if isinstance(outcome, str):
        return outcome
    if streaming:
        return _stream_tokens(llm, outcome)
    (text,) = llm.caller.block(lambda: llm.caller.aget([outcome]))
    return text
