"""``Eclectus``: a LlamaIndex LLM served by an Eclectus server.

A drop-in for any LlamaIndex LLM (``Settings.llm = Eclectus(url=...)``). What differs from a
plain completion client:

- Real async: ``acomplete``/``achat``/``astream_*`` await the SDK's futures; nothing runs a
  sync method in a thread.
- Prompt capture: ``predict``/``apredict``/``stream``/``astream`` send the template's constant
  text and its variables as separate segments (see :mod:`.prompts`), so the server sees
  which part of the prompt is shared and which is per-call.
- Graph building: :meth:`Eclectus.template_call` adds a call to the session's graph without
  waiting for it; a template variable may be another call's output. The graph synthesizers
  (:mod:`.tree_summarize`, :mod:`.refine`) use it to submit a whole tree or chain at once.

Every call of one ``Eclectus`` object belongs to one application session on the server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import llama_index.core.instrumentation as instrument
from eclectus.adapters.client import SemanticVariable, SyncSession
from eclectus.adapters.llamaindex.connection import Connection, Sampling
from eclectus.adapters.llamaindex.prompts import (
    chat_pieces,
    check_pieces,
    messages_to_prompt,
    template_pieces,
    template_values,
)
from eclectus.server.protocol import ModelInfo
from llama_index.core.base.llms.generic_utils import (
    astream_completion_response_to_chat_response,
    completion_response_to_chat_response,
    stream_completion_response_to_chat_response,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.instrumentation.events.llm import (
    LLMPredictEndEvent,
    LLMPredictStartEvent,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import LLM, astream_completion_response_to_tokens
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import TokenAsyncGen, TokenGen
from pydantic import ConfigDict, Field, PrivateAttr

dispatcher = instrument.get_dispatcher(__name__)

_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")


class Eclectus(LLM):
    """A LlamaIndex LLM whose calls run on an Eclectus server (one session per object)."""

    model_config = ConfigDict(populate_by_name=True)

    base_url: str = Field(alias="url", description="The server's WebSocket URL (ws://...).")
    token: str | None = Field(default=None, description="Bearer token, if the server wants one.")
    app_name: str = Field(
        default="llamaindex", alias="app", description="Application name shown by the server."
    )
    model: str | None = Field(
        default=None, description="Model to use; None takes the server's first model."
    )
    max_tokens: int = Field(
        default=128, ge=1, description="Tokens to generate per call; also `num_output`."
    )
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(default=-1, ge=-1, description="Top-k filter; -1 turns it off.")
    seed: int | None = Field(default=None, description="Makes sampled calls reproducible.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (not in output).")
    context_window: int | None = Field(
        default=None, description="Override the context window the server reports."
    )
    criteria: Literal["latency", "throughput"] = Field(
        default="latency", description="The objective of this app's gets."
    )

    _conn: Connection = PrivateAttr()

    def __init__(self, **data: Any) -> None:
        # Without this LLM's validator would install LlamaIndex's generic "role: content"
        # renderer; chat messages should reach the model in its own chat template.
        data.setdefault("messages_to_prompt", messages_to_prompt)
        super().__init__(**data)
        self._conn = Connection(self.base_url, self.token, self.app_name)

    @classmethod
    def class_name(cls) -> str:
        return "Eclectus"

    # -- metadata ---------------------------------------------------------------------------

    @property
    def client(self) -> SyncSession:
        """The SDK session (mutates: connects on first use)."""
        return self._conn.session

    def _model_info(self) -> ModelInfo:
        models = self.client.models
        for info in models:
            if self.model is None or info.name == self.model:
                return info
        names = [info.name for info in models]
        raise ValueError(f"model {self.model!r} is not served here (models: {names})")

    @property
    def metadata(self) -> LLMMetadata:
        """Context window and model name from the server; ``num_output`` is ``max_tokens``.
        Connects on first use. A completion model: templates are formatted as text."""
        info = self._model_info()
        return LLMMetadata(
            context_window=self.context_window or info.context_window,
            num_output=self.max_tokens,
            is_chat_model=False,
            model_name=info.name,
        )

    def close(self) -> None:
        """Close the session (mutates; idempotent). A later call reconnects."""
        self._conn.close()

    # -- building calls (no waiting) --------------------------------------------------------

    def _sampling(self, kwargs: Mapping[str, Any]) -> Sampling:
        """Per-call overrides from ``kwargs`` (unknown keys are LlamaIndex's, ignored)."""
        given = {key: kwargs[key] for key in _SAMPLING_KEYS if kwargs.get(key) is not None}
        defaults = {key: getattr(self, key) for key in _SAMPLING_KEYS}
        merged = {**defaults, **given}
        merged["stop"] = tuple(merged["stop"])
        return Sampling(**merged)

    def call(self, pieces: Sequence[str | SemanticVariable], **kwargs: Any) -> SemanticVariable:
        """Add one call to the session's graph: ``pieces`` (text or variables) then one
        generated output, returned as a SemanticVariable (mutates: buffers the call; it is
        sent with the next get)."""
        gen = self._sampling(kwargs).gen()
        (output,) = self.client.call([*pieces, gen], model=self.model)
        return output

    def join(self, items: Sequence[str | SemanticVariable], sep: str = "") -> SemanticVariable:
        """A variable the server computes as ``sep.join(items)`` (mutates: buffers an op)."""
        return self.client.join(items, sep=sep)

    async def aget_many(self, variables: Sequence[SemanticVariable]) -> list[str]:
        """The values of ``variables``, asked for in one get from any event loop (mutates:
        ships the pending calls and activates what the variables depend on)."""
        return await self.client.session.aget_many(list(variables), self.criteria)

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
                    else self.client.variable(value=str(value), name=piece.name)
                )
            segments.append(variables[piece.name])
        return segments

    def _message_segments(self, messages: Sequence[ChatMessage]) -> list[str]:
        if self.messages_to_prompt is messages_to_prompt:
            return chat_pieces(messages)
        return [self.messages_to_prompt(messages)]

    # -- answers from a call's output -------------------------------------------------------

    def _response(self, var: SemanticVariable, text: str) -> CompletionResponse:
        usage = getattr(var, "usage", None)
        extra = usage.model_dump() if hasattr(usage, "model_dump") else {}
        return CompletionResponse(text=text, additional_kwargs=extra)

    def _fetch(self, var: SemanticVariable) -> CompletionResponse:
        return self._response(var, var.get(criteria=self.criteria))

    async def _afetch(self, var: SemanticVariable) -> CompletionResponse:
        return self._response(var, await var.aget(criteria=self.criteria))

    def _stream(self, var: SemanticVariable) -> CompletionResponseGen:
        text = ""
        for delta in var.stream():
            text += delta
            yield CompletionResponse(text=text, delta=delta)

    async def _astream(self, var: SemanticVariable) -> CompletionResponseAsyncGen:
        text = ""
        async for delta in var.astream():
            text += delta
            yield CompletionResponse(text=text, delta=delta)

    def _prompt_call(self, prompt: str, formatted: bool, kwargs: Any) -> SemanticVariable:
        if not formatted:
            prompt = self.completion_to_prompt(prompt)
        return self.call([prompt], **kwargs)

    # -- the LLM interface ------------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._fetch(self._prompt_call(prompt, formatted, kwargs))

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        return await self._afetch(self._prompt_call(prompt, formatted, kwargs))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        return self._stream(self._prompt_call(prompt, formatted, kwargs))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        return self._astream(self._prompt_call(prompt, formatted, kwargs))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        var = self.call(self._message_segments(messages), **kwargs)
        return completion_response_to_chat_response(self._fetch(var))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        var = self.call(self._message_segments(messages), **kwargs)
        return completion_response_to_chat_response(await self._afetch(var))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        var = self.call(self._message_segments(messages), **kwargs)
        return stream_completion_response_to_chat_response(self._stream(var))

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        var = self.call(self._message_segments(messages), **kwargs)
        return astream_completion_response_to_chat_response(self._astream(var))

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
