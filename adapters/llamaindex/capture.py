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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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

from eclectus.adapters.calls import Caller
from eclectus.adapters.client import SemanticVariable, SyncSession
from eclectus.adapters.llamaindex.prompts import check_pieces, template_pieces, template_values

dispatcher = instrument.get_dispatcher(__name__)

# Declares one call on a session and returns its output: run again on a fresh session when
# the connection was lost (the shared client layer's retries).
Build = Callable[[SyncSession], SemanticVariable]


class CapturingLLM(LLM):
    """Base of :class:`~eclectus.adapters.llamaindex.Eclectus`: everything that depends only
    on "a call is a list of pieces whose output is a SemanticVariable"."""

    @property
    @abstractmethod
    def caller(self) -> Caller:
        """The shared client layer's caller: session, retries, timeout, criteria."""

    @abstractmethod
    def _declare(
        self,
        session: SyncSession,
        pieces: Sequence[str | SemanticVariable],
        kwargs: Any,
        add_special_tokens: bool = True,
    ) -> SemanticVariable:
        """Add one call (``pieces`` then one generated output, sampled with the LLM's
        settings overridden by ``kwargs``) to ``session``'s graph and return its output
        variable without waiting (mutates: buffers the call). ``add_special_tokens``
        False: the pieces are a chat template's render (CallSpec.add_special_tokens)."""

    def _renders_chat(self, prompt: BasePromptTemplate) -> bool:
        """Whether ``prompt`` renders through a chat template, so its call takes no added
        special tokens (pure). None here; the Eclectus LLM says when its template does."""
        return False

    def call(self, pieces: Sequence[str | SemanticVariable], **kwargs: Any) -> SemanticVariable:
        """Add one call to the session's graph: ``pieces`` (text or variables of this LLM's
        session) then one generated output, returned as a SemanticVariable (mutates: buffers
        the call; it is sent with the next get). Sampling keywords override the LLM's."""
        return self._declare(self.caller.session, pieces, kwargs)

    def template_call(self, prompt: BasePromptTemplate, **prompt_args: Any) -> SemanticVariable:
        """Add ``prompt`` formatted with ``prompt_args`` as one call and return its output
        variable without waiting (mutates: buffers the call). A value may be a
        SemanticVariable, so calls can consume each other's outputs on the server."""
        session = self.caller.session
        segments = self._template_segments(session, prompt, prompt_args)
        return self._declare(session, segments, {}, not self._renders_chat(prompt))

    def _template_segments(
        self, session: SyncSession, prompt: BasePromptTemplate, prompt_args: Mapping[str, Any]
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
                    else session.variable(value=str(value), name=piece.name)
                )
            segments.append(variables[piece.name])
        return segments

    # -- answers: through the shared client layer (retries, timeout, criteria, deadline) ----

    def _response(self, var: SemanticVariable, text: str) -> CompletionResponse:
        # the producing call's token counts, where LlamaIndex's TokenCountingHandler reads
        # them (raw["usage"], as from OpenAI) and in additional_kwargs as before
        extra = var.usage.model_dump() if var.usage is not None else {}
        return CompletionResponse(text=text, additional_kwargs=extra, raw={"usage": extra})

    def _fetch(self, build: Build) -> CompletionResponse:
        return self.caller.block(lambda: self._afetch(build))

    async def _afetch(self, build: Build) -> CompletionResponse:
        ((var, text),) = await self.caller.arun(lambda session: [build(session)])
        return self._response(var, text)

    def _stream(self, build: Build) -> CompletionResponseGen:
        yield from self.caller.iterate(self._astream(build))

    async def _astream(self, build: Build) -> CompletionResponseAsyncGen:
        text = ""
        async for item in self.caller.astream(build):
            if isinstance(item, str):
                text += item
                yield CompletionResponse(text=text, delta=item)

    # -- prompt capture: templates reach the server as segments -----------------------------
    # The *_captured methods carry LlamaIndex's completion callbacks (token counters and
    # tracing see the rendered prompt string), and take the call's builder.

    @llm_completion_callback()
    def _complete_captured(self, prompt: str, build: Build) -> CompletionResponse:
        return self._fetch(build)

    @llm_completion_callback()
    async def _acomplete_captured(self, prompt: str, build: Build) -> CompletionResponse:
        return await self._afetch(build)

    @llm_completion_callback()
    def _stream_captured(self, prompt: str, build: Build) -> CompletionResponseGen:
        return self._stream(build)

    @llm_completion_callback()
    async def _astream_captured(self, prompt: str, build: Build) -> CompletionResponseAsyncGen:
        return self._astream(build)

    def _capture(
        self, prompt: BasePromptTemplate, prompt_args: dict[str, Any]
    ) -> tuple[str, Build]:
        """Emit LlamaIndex's predict events; return the rendered prompt and the builder of
        its call (pure otherwise: the call is declared when it is asked for)."""
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=prompt_args))
        self._log_template_data(prompt, **prompt_args)
        return self.template_request(prompt, prompt_args, {})

    def template_request(
        self, prompt: BasePromptTemplate, prompt_args: Mapping[str, Any], kwargs: Mapping[str, Any]
    ) -> tuple[str, Build]:
        """The rendered prompt and the builder of its call, sampled with ``kwargs`` over the
        LLM's settings (pure: the call is declared when it is asked for). Feed both to the
        ``*_captured`` methods."""
        text = self._get_prompt(prompt, **prompt_args)

        special = not self._renders_chat(prompt)

        def build(session: SyncSession) -> SemanticVariable:
            segments = self._template_segments(session, prompt, prompt_args)
            return self._declare(session, segments, kwargs, special)

        return text, build

    def _no_parser_for_streaming(self, prompt: BasePromptTemplate) -> None:
        if prompt.output_parser is not None or self.output_parser is not None:
            raise NotImplementedError("Output parser is not supported for streaming.")

    @dispatcher.span
    def predict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        text, build = self._capture(prompt, prompt_args)
        output = self._parse_output(self._complete_captured(text, build).text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    async def apredict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        text, build = self._capture(prompt, prompt_args)
        output = self._parse_output((await self._acomplete_captured(text, build)).text)
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    @dispatcher.span
    def stream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenGen:
        self._no_parser_for_streaming(prompt)
        text, build = self._capture(prompt, prompt_args)
        return (r.delta or "" for r in self._stream_captured(text, build))

    @dispatcher.span
    async def astream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenAsyncGen:
        self._no_parser_for_streaming(prompt)
        text, build = self._capture(prompt, prompt_args)
        return await astream_completion_response_to_tokens(
            await self._astream_captured(text, build)
        )
