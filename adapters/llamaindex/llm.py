"""``Eclectus``: a LlamaIndex LLM served by an Eclectus server.

A drop-in for any LlamaIndex LLM (``Settings.llm = Eclectus(url=...)``). What differs from a
plain completion client:

- Real async: ``acomplete``/``achat``/``astream_*`` await the SDK's futures; nothing runs a
  sync method in a thread.
- Prompt capture: ``predict``/``apredict``/``stream``/``astream`` send the template's constant
  text and its variables as separate segments (see :mod:`.prompts`), so the server sees
  which part of the prompt is shared and which is per-call.
- Function calling: a LlamaIndex ``FunctionCallingLLM`` (``chat_with_tools``,
  ``get_tool_calls_from_response``; FunctionAgent runs on it): the tools reach the served
  model's chat template, and required or named calls are enforced by the server's grammar
  (see :mod:`.tools`).
- Structured output: ``structured_predict`` and ``as_structured_llm`` constrain the output
  to the class's JSON Schema, so it validates by construction (see :mod:`.structured`).
- Graph building: :meth:`Eclectus.template_call` adds a call to the session's graph without
  waiting for it; a template variable may be another call's output. The graph synthesizers
  (:mod:`.tree_summarize`, :mod:`.refine`) use it to submit a whole tree or chain at once.

Every call of one ``Eclectus`` object belongs to one application session on the server (the
shared client layer's session for its url, token and app: :mod:`eclectus.adapters.connection`),
with its retries, request timeout, criteria and deadline (:mod:`eclectus.adapters.calls`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

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
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.tools.types import BaseTool
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from eclectus.adapters.calls import DEFAULT_MAX_RETRIES, Caller, CallOptions
from eclectus.adapters.client import Gen, SemanticVariable, SyncSession
from eclectus.adapters.connection import connection_for, default_token, default_url
from eclectus.adapters.llamaindex.capture import Build
from eclectus.adapters.llamaindex.prompts import (
    ServedChatTemplate,
    is_chat_prompt,
    messages_to_prompt,
)
from eclectus.adapters.llamaindex.structured import ConstrainedLLM
from eclectus.adapters.llamaindex.token_cache import TokenCache
from eclectus.adapters.llamaindex.tools import (
    ReplyReader,
    achat_stream,
    chat_response,
    chat_stream,
    has_tools,
    prepare_chat_with_tools,
    split_tool_kwargs,
    tool_selections,
)
from eclectus.adapters.sampling import SAMPLING_KEYS, build_sampling
from eclectus.protocol import ModelCard, SamplingParams
from eclectus.protocol.openai_tools import ChatConstraint

# ids in all: room for a few long documents and the words LlamaIndex's splitters count
DEFAULT_TOKENIZER_CACHE_TOKENS = 1 << 18
# The named sampling fields; every other contract field (``stop_token_ids``, any added
# later) is taken from ``additional_kwargs`` or a call-time keyword.
NAMED_SAMPLING_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
)
# num_output when max_tokens is None and the server announces no cap: LlamaIndex's own
# OpenAI LLM says ``self.max_tokens or -1`` (nothing reserved for the answer).
UNBOUNDED_NUM_OUTPUT = -1


class Eclectus(ConstrainedLLM, FunctionCallingLLM):
    """A LlamaIndex LLM whose calls run on an Eclectus server.

    Sampling fields left None take the contract's defaults (``max_tokens`` None: until the
    end-of-sequence token or the context window; docs/protocol.md, "Defaults"). The
    session is the shared client layer's for (url, token, app): see
    :mod:`eclectus.adapters.connection`.
    """

    model_config = ConfigDict(populate_by_name=True)

    base_url: str = Field(
        alias="url",
        default_factory=default_url,
        description="The server's URL (ws://, or http:// converted); default: $ECLECTUS_URL, "
        "else local.",
    )
    token: str | None = Field(
        default_factory=default_token, description="Bearer token; default: $ECLECTUS_TOKEN."
    )
    app_name: str = Field(
        default="llamaindex", alias="app", description="Application name shown by the server."
    )
    model: str | None = Field(
        default=None, description="Model to use; None takes the server's first model."
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens to generate per call; None: until EOS or the context window. "
        "Also `num_output`.",
    )
    temperature: float | None = Field(default=None, description="0 (the default) is greedy.")
    top_p: float | None = Field(default=None, description="Nucleus sampling mass.")
    top_k: int | None = Field(default=None, description="Top-k filter; -1 (default) is off.")
    seed: int | None = Field(default=None, description="Makes sampled calls reproducible.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (not in output).")
    ignore_eos: bool | None = Field(
        default=None, description="Keep generating past EOS until max_tokens."
    )
    additional_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Further sampling options: any field of the contract's SamplingParams.",
    )
    request_timeout: float | None = Field(
        default=None,
        alias="timeout",
        description="Seconds to wait for a call's text, or each delta of a stream; None: no limit.",
    )
    max_retries: int = Field(
        default=DEFAULT_MAX_RETRIES, ge=0, description="Retries after a lost connection."
    )
    criteria: Literal["latency", "throughput", "deadline"] = Field(
        default="latency", description="The objective of this LLM's gets."
    )
    deadline_ms: float | None = Field(
        default=None, description="With criteria='deadline': milliseconds to the answer."
    )
    context_window: int | None = Field(
        default=None, description="Override the context window the server reports."
    )
    tokenizer_cache_tokens: int = Field(
        default=DEFAULT_TOKENIZER_CACHE_TOKENS,
        ge=0,
        description="Token ids `tokenizer` keeps cached (LRU, exact); 0: a round trip per call.",
    )
    _caller: Caller = PrivateAttr()
    _token_cache: TokenCache = PrivateAttr()

    @model_validator(mode="after")
    def _settings_fit(self) -> Eclectus:
        """Call options and sampling settings are checked once, at construction."""
        self._options()
        self._sampling({})
        return self

    def _options(self) -> CallOptions:
        return CallOptions(
            max_retries=self.max_retries,
            request_timeout=self.request_timeout,
            criteria=self.criteria,
            deadline_ms=self.deadline_ms,
        )

    def __init__(self, **data: Any) -> None:
        given = data.get("messages_to_prompt")
        super().__init__(**data)
        connection = connection_for(self.base_url, self.token, self.app_name)
        self._caller = Caller(connection, self._options())
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
    def caller(self) -> Caller:
        return self._caller

    @property
    def client(self) -> SyncSession:
        """The SDK session (mutates: connects on first use)."""
        return self._caller.session

    def _model_info(self, session: SyncSession | None = None) -> ModelCard:
        """This LLM's entry in the welcome of ``session``, else of the connection's session
        (no I/O once one is open; else blocking: connects). ValueError if not served."""
        models = session.models if session is not None else self._caller.served_models()
        for info in models:
            if self.model is None or info.name == self.model:
                return info
        names = [info.name for info in models]
        raise ValueError(f"model {self.model!r} is not served here (models: {names})")

    @property
    def metadata(self) -> LLMMetadata:
        """Context window and model name from the server. ``num_output`` is ``max_tokens``,
        capped by the model's ``max_output_tokens`` when the server announces one; with
        ``max_tokens`` None it is that cap, else -1, as LlamaIndex's OpenAI LLM says
        (nothing reserved for the answer). Connects on first use. A completion model
        (templates are formatted as text) that does function calling."""
        info = self._model_info()
        caps = [n for n in (self.max_tokens, info.max_output_tokens) if n is not None]
        return LLMMetadata(
            context_window=self.context_window or info.context_window,
            num_output=min(caps) if caps else UNBOUNDED_NUM_OUTPUT,
            is_chat_model=False,
            is_function_calling_model=True,
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
        """Close the session (mutates; idempotent). A later call reconnects. The session is
        shared by every Eclectus LLM with the same url, token and app."""
        self._caller.connection.close()

    # -- building calls (no waiting) --------------------------------------------------------

    def _sampling(self, kwargs: Mapping[str, Any]) -> SamplingParams:
        """The contract's SamplingParams for one call: the fields, ``additional_kwargs``,
        then per-call overrides from ``kwargs`` (keys that are not sampling options are
        LlamaIndex's, ignored). Pure; ValueError for a value out of range."""
        fields = {key: getattr(self, key) for key in NAMED_SAMPLING_FIELDS}
        given = {key: value for key, value in kwargs.items() if key in SAMPLING_KEYS}
        return build_sampling(fields, self.additional_kwargs, given, where="Eclectus")

    def _declare(
        self,
        session: SyncSession,
        pieces: Sequence[str | SemanticVariable],
        kwargs: Any,
        add_special_tokens: bool = True,
    ) -> SemanticVariable:
        sampling = self._sampling(kwargs)
        # never ask for more than the server allows: num_output promised LlamaIndex as much
        limit = self._model_info(session).max_output_tokens
        if limit is not None and (sampling.max_tokens or limit) >= limit:
            sampling = sampling.model_copy(update={"max_tokens": limit})
        call = [*pieces, Gen(sampling=sampling)]
        (output,) = session.call(call, model=self.model, add_special_tokens=add_special_tokens)
        return output

    def _renders_chat(self, prompt: BasePromptTemplate) -> bool:
        """Whether ``prompt`` is formatted with the served chat template (pure)."""
        return self._served_template() and is_chat_prompt(prompt, self)

    def _served_template(self) -> bool:
        """Whether chats render in the served model's chat template: a prompt that then
        takes no added special tokens, as vLLM's chat endpoint (pure)."""
        return isinstance(self.messages_to_prompt, ServedChatTemplate)

    def join(self, items: Sequence[str | SemanticVariable], sep: str = "") -> SemanticVariable:
        """A variable the server computes as ``sep.join(items)`` (mutates: buffers an op)."""
        return self.client.join(items, sep=sep)

    async def aget_many(self, variables: Sequence[SemanticVariable]) -> list[str]:
        """The values of ``variables``, asked for in one get from any event loop with this
        LLM's criteria, deadline and timeout (mutates: ships the pending calls and
        activates what the variables depend on)."""
        return await self._caller.aget(list(variables))

    def _message_segments(
        self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] = ()
    ) -> list[str]:
        """Chat messages (and ``tools``, OpenAI tool objects) as text segments: in the chat
        template the server announces for the model (the built-in one when it announces
        none), unless the user installed their own ``messages_to_prompt`` (then its string
        is one segment, and it cannot show tools: ValueError). Connects on first use."""
        if isinstance(self.messages_to_prompt, ServedChatTemplate):
            return self.messages_to_prompt.pieces(messages, tools)
        if tools:
            raise ValueError(
                "Eclectus: tools need the served chat template; a custom messages_to_prompt "
                "cannot render them"
            )
        return [self.messages_to_prompt(messages)]

    def _prompt_build(self, prompt: str, formatted: bool, kwargs: Any) -> Build:
        if not formatted:
            prompt = self.completion_to_prompt(prompt)
        return lambda session: self._declare(session, [prompt], kwargs)

    def _chat_build(
        self, messages: Sequence[ChatMessage], kwargs: Mapping[str, Any]
    ) -> tuple[Build, ChatConstraint]:
        """The builder of a chat call and its tools' constraint, with calls in the syntax the
        server announces for the model (connects on first use; ValueError for malformed
        tools, see :func:`.tools.split_tool_kwargs`)."""
        fmt = self._model_info().tool_call_format if has_tools(kwargs) else "hermes"
        rest, constraint = split_tool_kwargs(kwargs, fmt)
        segments = self._message_segments(messages, constraint.tools)
        special = not self._served_template()
        return (lambda session: self._declare(session, segments, rest, special)), constraint

    # -- the LLM interface ------------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._fetch(self._prompt_build(prompt, formatted, kwargs))

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        return await self._afetch(self._prompt_build(prompt, formatted, kwargs))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        return self._stream(self._prompt_build(prompt, formatted, kwargs))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        return self._astream(self._prompt_build(prompt, formatted, kwargs))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        build, constraint = self._chat_build(messages, kwargs)
        return chat_response(self._fetch(build), constraint)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        build, constraint = self._chat_build(messages, kwargs)
        return chat_response(await self._afetch(build), constraint)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        build, constraint = self._chat_build(messages, kwargs)
        return chat_stream(self._stream(build), ReplyReader(constraint))

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        build, constraint = self._chat_build(messages, kwargs)
        return achat_stream(self._astream(build), ReplyReader(constraint))

    # -- function calling -------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``chat`` kwargs for ``chat_with_tools`` and its twins (pure): the tools as
        OpenAI tool objects; ``tool_choice`` "auto" (default), "none", "required" (or
        ``tool_required=True``), a tool's name or OpenAI's named form; with
        ``allow_parallel_tool_calls`` False (LlamaIndex's default) at most one call. The
        grammar enforces required and named choices and every call's arguments."""
        return prepare_chat_with_tools(
            tools,
            user_msg,
            chat_history,
            allow_parallel_tool_calls,
            tool_required,
            tool_choice,
            kwargs,
        )

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        """The calls of a reply (pure); ValueError when there are none and
        ``error_on_no_tool_call``."""
        selections = tool_selections(response.message)
        if not selections and error_on_no_tool_call:
            raise ValueError("Expected at least one tool call, but the reply made none.")
        return selections
