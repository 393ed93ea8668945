"""Prompt capture: an LLM whose calls are SemanticVariables, with LlamaIndex's template
entry points (``predict``, ``apredict``, ``stream``, ``astream``) overridden so that a
template's constant text and its variables reach the server as separate segments.

The overrides keep LlamaIndex's contract: the same predict events and completion callbacks
(token counters and tracing see the rendered prompt string), the same output parsing, and
the same model input, since the segments concatenate to exactly the string LlamaIndex would
have sent (see :mod:`.prompts`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import llama_index.core.instrumentation as instrument
from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
)
from llama_index.core.instrumentation.events.llm import (
    LLMPredictEndEvent,
    LLMPredictStartEvent,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.llm import LLM, astream_completion_response_to_tokens
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import TokenAsyncGen, TokenGen
from pydantic import Field

from eclectus.adapters.client import SemanticVariable
from eclectus.adapters.llamaindex.prompts import check_pieces, template_pieces, template_values

dispatcher = instrument.get_dispatcher(__name__)


class CapturingLLM(LLM):
    """Base of :class:`~eclectus.adapters.llamaindex.Eclectus`: everything that depends only
    on "a call is a list of pieces whose output is a SemanticVariable"."""

    criteria: Literal["latency", "throughput"] = Field(
        default="latency", description="The objective of this app's gets."
    )

    @abstractmethod
    def call(self, pieces: Sequence[str | SemanticVariable], **kwargs: Any) -> SemanticVariable:
        """Add one call (``pieces`` then one generated output) to the session's graph and
        return its output variable without waiting (mutates: buffers the call)."""

    @abstractmethod
    def _constant(self, value: str, name: str) -> SemanticVariable:
        """A named constant variable in the session (mutates: buffers its declaration)."""

    def template_call(self, prompt: BasePromptTemplate, **prompt_args: Any) -> SemanticVariable:
        """Add ``prompt`` formatted with ``prompt_args`` as one call and return its output
        variable without waiting (mutates: buffers the call). A value may be a
        SemanticVariable, so calls can consume each other's outputs on the server."""
        return self.call(self._template_segments(prompt, prompt_args))

    def _template_segments(
        self, prompt: BasePromptTemplate, prompt_args: Mapping[str, Any]
    ) -> list[str | SemanticVariable]:
        pieces = template_pieces(self._get_prompt, prompt, prompt_args)
        values = template_values(prompt, prompt_args)
        if all(isinstance(v, str) for v in values.values()):
            expected = self._get_prompt(prompt, **prompt_args)
            if not check_pieces(pieces, values, expected):
                return [expected]  # a mapping or parser rewrote a value: send the string
        variables: dict[str, SemanticVariable] = {}
        segments: list[str | SemanticVariable] = []
        for piece in pieces:
            if isinstance(piece, str):
                segments.append(piece)
                continue
            if piece.name not in variables:
                value = values[piece.name]
                variables[piece.name] = (
                    value
                    if isinstance(value, SemanticVariable)
                    else self._constant(str(value), piece.name)
                )
            segments.append(variables[piece.name])
        return segments

    # -- answers from a call's output -------------------------------------------------------

    def _response(self, var: SemanticVariable, text: str) -> CompletionResponse:
        # token counts of the producing call, for LlamaIndex's token-counting handlers
        extra = var.usage.model_dump() if var.usage is not None else {}
        return CompletionResponse(text=text, additional_kwargs=extra)

    def _fetch(self, var: SemanticVariable) -> CompletionResponse:
        return self._response(var, var.get(criteria=self.criteria))

    async def _afetch(self, var: SemanticVariable) -> CompletionResponse:
        return self._response(var, await var.aget(criteria=self.criteria))

    def _stream(self, var: SemanticVariable) -> CompletionResponseGen:
        text = ""
        for delta in var.stream(self.criteria):
            text += delta
            yield CompletionResponse(text=text, delta=delta)

    async def _astream(self, var: SemanticVariable) -> CompletionResponseAsyncGen:
        text = ""
        async for delta in var.astream(self.criteria):
            text += delta
            yield CompletionResponse(text=text, delta=delta)

    # -- prompt capture: templates reach the server as segments -----------------------------
    # The *_captured methods carry LlamaIndex's completion callbacks (token counters and
    # tracing see the rendered prompt string), and take the already-built call.

    @llm_completion_callback()
    def _complete_captured(self, prompt: str, var: SemanticVariable) -> CompletionResponse:
        return self._fetch(var)

    @llm_completion_callback()
    async def _acomplete_captured(self, prompt: str, var: SemanticVariable) -> CompletionResponse:
        return await self._afetch(var)

    @llm_completion_callback()
    def _stream_captured(self, prompt: str, var: SemanticVariable) -> CompletionResponseGen:
        return self._stream(var)

    @llm_completion_callback()
    async def _astream_captured(
        self, prompt: str, var: SemanticVariable
    ) -> CompletionResponseAsyncGen:
        return self._astream(var)

    def _capture(
        self, prompt: BasePromptTemplate, prompt_args: dict[str, Any]
    ) -> tuple[str, SemanticVariable]:
        """Emit LlamaIndex's predict events and build the call (mutates: buffers it)."""
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=prompt_args))
        self._log_template_data(prompt, **prompt_args)
        text = self._get_prompt(prompt, **prompt_args)
        return text, self.call(self._template_segments(prompt, prompt_args))

    def _no_parser_for_streaming(self, prompt: BasePromptTemplate) -> None:
        if prompt.output_parser is not None or self.output_parser is not None:
            raise NotImplementedError("Output parser is not supported for streaming.")

    @dispatcher.span
    def predict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        text, var = self._capture(prompt, prompt_args)
        output = self._parse_output(self._complete_captured(text, var).text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    async def apredict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        text, var = self._capture(prompt, prompt_args)
        output = self._parse_output((await self._acomplete_captured(text, var)).text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    def stream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenGen:
        self._no_parser_for_streaming(prompt)
        text, var = self._capture(prompt, prompt_args)
        return (r.delta or "" for r in self._stream_captured(text, var))

    @dispatcher.span
    async def astream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenAsyncGen:
        self._no_parser_for_streaming(prompt)
        text, var = self._capture(prompt, prompt_args)
        return await astream_completion_response_to_tokens(await self._astream_captured(text, var))
