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

import os
from collections.abc import Mapping, Sequence
from typing import Any

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
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from pydantic import ConfigDict, Field, PrivateAttr

from eclectus.adapters.client import DEFAULT_URL, SemanticVariable, SyncSession
from eclectus.adapters.llamaindex.capture import CapturingLLM
from eclectus.adapters.llamaindex.connection import Connection, Sampling
from eclectus.adapters.llamaindex.prompts import ServedChatTemplate, messages_to_prompt
from eclectus.adapters.llamaindex.token_cache import TokenCache
from eclectus.protocol import ModelCard

URL_ENV = "ECLECTUS_URL"
# ids in all: room for a few long documents and the words LlamaIndex's splitters count
DEFAULT_TOKENIZER_CACHE_TOKENS = 1 << 18
_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")


class Eclectus(CapturingLLM):
    """A LlamaIndex LLM whose calls run on an Eclectus server (one session per object)."""

    model_config = ConfigDict(populate_by_name=True)

    base_url: str = Field(
        alias="url",
        default_factory=lambda: os.environ.get(URL_ENV) or DEFAULT_URL,
        description="The server's WebSocket URL (ws://...); default: $ECLECTUS_URL, else local.",
    )
    token: str | None = Field(
        default=None, description="Bearer token; default: $ECLECTUS_TOKEN (read by the SDK)."
    )
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
    tokenizer_cache_tokens: int = Field(
        default=DEFAULT_TOKENIZER_CACHE_TOKENS,
        ge=0,
        description="Token ids `tokenizer` keeps cached (LRU, exact); 0: a round trip per call.",
    )
    _conn: Connection = PrivateAttr()
    _token_cache: TokenCache = PrivateAttr()

    def __init__(self, **data: Any) -> None:
        given = data.get("messages_to_prompt")
        super().__init__(**data)
        self._conn = Connection(self.base_url, self.token, self.app_name)
        self._token_cache = TokenCache(self.tokenizer_cache_tokens)
        if given is None or given is messages_to_prompt:
            # Not LlamaIndex's generic "role: content" renderer (its validator's default):
            # every path that renders chat messages through this hook (chat(), and the
            # chat prompt templates LlamaIndex formats in _get_prompt) gets the served
            # model's own chat template.
            self.messages_to_prompt = ServedChatTemplate(self._model_info)

    @classmethod
    def class_name(cls) -> str:
        return "Eclectus"

    # -- metadata ---------------------------------------------------------------------------

    @property
    def client(self) -> SyncSession:
        """The SDK session (mutates: connects on first use)."""
        return self._conn.session

    def _model_info(self) -> ModelCard:
        models = self.client.models
        for info in models:
            if self.model is None or info.name == self.model:
                return info
        names = [info.name for info in models]
        raise ValueError(f"model {self.model!r} is not served here (models: {names})")

    @property
    def metadata(self) -> LLMMetadata:
        """Context window and model name from the server; ``num_output`` is ``max_tokens``,
        capped by the model's ``max_output_tokens`` when the server announces one.
        Connects on first use. A completion model: templates are formatted as text."""
        info = self._model_info()
        return LLMMetadata(
            context_window=self.context_window or info.context_window,
            num_output=min(self.max_tokens, info.max_output_tokens or self.max_tokens),
            is_chat_model=False,
            model_name=info.name,
        )

    def tokenizer(self, text: str) -> list[int]:
        """The server model's token ids of ``text``: assign ``Settings.tokenizer =
        llm.tokenizer`` so that LlamaIndex packs chunks in this model's tokens (its default
        counts in tiktoken's, which can overfill a byte-level or other model's window).
        One ``tokenize`` round trip per distinct text: answers are cached (see
        :mod:`.token_cache`; mutates the cache, connects on first use)."""
        if not isinstance(text, str):
            raise TypeError(f"tokenizer takes a str, got {type(text).__name__}")
        session, model = self.client, self.model
        return self._token_cache.ids(
            (session, model), text, lambda t: session.tokenize(t, model=model)
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
        # never ask for more than the server allows: num_output promised LlamaIndex as much
        limit = self._model_info().max_output_tokens
        if limit is not None:
            merged["max_tokens"] = min(merged["max_tokens"], limit)
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

    def _constant(self, value: str, name: str) -> SemanticVariable:
        return self.client.variable(value=value, name=name)

    def _message_segments(self, messages: Sequence[ChatMessage]) -> list[str]:
        """Chat messages as text segments: in the chat template the server announces for
        the model (the built-in one when it announces none), unless the user installed
        their own ``messages_to_prompt`` (then its string is one segment). Connects on
        first use."""
        if isinstance(self.messages_to_prompt, ServedChatTemplate):
            return self.messages_to_prompt.pieces(messages)
        return [self.messages_to_prompt(messages)]

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
