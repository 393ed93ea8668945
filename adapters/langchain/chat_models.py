"""ChatEclectus: a drop-in LangChain chat model served by Eclectus.

``from langchain_openai import ChatOpenAI`` becomes
``from eclectus.adapters.langchain import ChatEclectus as ChatOpenAI`` and the constructor
arguments stay. Messages are rendered on the client in the served model's chat template, as
the server announces it (chat_format.py); inside a chain, the prompt template's constant
text and variable values go to the server as separate segments (tracing.py) for exact
prefix sharing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig

from eclectus.adapters.langchain._calls import (
    ModelCore,
    PrefetchKey,
    prefetch_key,
    reset_prefetched,
    set_prefetched,
    take_prefetched,
)
from eclectus.adapters.langchain._client import Generated
from eclectus.adapters.langchain._common import EclectusParams
from eclectus.adapters.langchain.chat_format import (
    DEFAULT_TEMPLATE,
    ChatTemplate,
    message_role,
    render_chat,
)
from eclectus.adapters.langchain.pieces import Piece, concrete_text
from eclectus.adapters.langchain.tracing import TRACER
from eclectus.protocol import SamplingParams

# (prompt pieces, sampling, model) of one chat call
Request = tuple[list[Piece], SamplingParams, str | None]


def usage_of(result: Generated) -> UsageMetadata:
    """LangChain usage metadata for one finished call (pure)."""
    return UsageMetadata(
        input_tokens=result.prompt_tokens,
        output_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
        input_token_details=InputTokenDetails(cache_read=result.cached_tokens),
    )


def metadata_of(result: Generated) -> dict[str, Any]:
    """Response metadata for one finished call (pure)."""
    return {
        "model_name": result.model_name,
        "model_provider": "eclectus",
        "finish_reason": result.finish_reason,
    }


def message_of(result: Generated) -> AIMessage:
    """The AIMessage of one finished call (pure)."""
    return AIMessage(
        content=result.text,
        usage_metadata=usage_of(result),
        response_metadata=metadata_of(result),
    )


class ChatEclectus(EclectusParams, BaseChatModel):
    """Chat model on an Eclectus server (a drop-in for ``ChatOpenAI``).

    Example:
        ```python
        from eclectus.adapters.langchain import ChatEclectus

        model = ChatEclectus(model="tiny", base_url="ws://127.0.0.1:8765", max_tokens=32)
        model.invoke("Hello")
        ```
    """

    @property
    def _llm_type(self) -> str:
        return "eclectus-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = self.ls_params(stop, kwargs)
        return LangSmithParams(ls_model_type="chat", **params)  # type: ignore[typeddict-item]

    # -- building one request --------------------------------------------------------------

    def prompt_pieces(
        self, messages: Sequence[BaseMessage], template: ChatTemplate = DEFAULT_TEMPLATE
    ) -> list[Piece]:
        """The prompt for ``messages``, rendered with ``template`` (the served model's, see
        :meth:`_request`); known template boundaries (tracing hook) become segment
        boundaries. Pure apart from the lookup."""
        per_message = TRACER.message_pieces(messages)
        roles = [message_role(m) for m in messages]
        return render_chat(list(zip(roles, per_message, strict=True)), template)

    def _request(
        self,
        messages: Sequence[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        core: ModelCore,
    ) -> Request:
        """Pieces (in the chat template ``core``'s server announces: connects on first
        use), sampling payload and model of one call."""
        model = self.model_for(kwargs)
        pieces = self.prompt_pieces(messages, core.chat_template(model))
        return pieces, self.sampling(stop, kwargs), model

    def _core(self, run_manager: Any) -> ModelCore:
        run_id = getattr(run_manager, "run_id", None)
        return ModelCore(self, TRACER.app_of(run_id))

    # -- LangChain's entry points ------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        core = self._core(run_manager)
        pieces, sampling, model = self._request(messages, stop, kwargs, core)
        result = take_prefetched(prefetch_key(pieces, sampling, model))
        if result is None:
            (result,) = core.run([(pieces, sampling)], model)
        return _chat_result(result)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        core = self._core(run_manager)
        pieces, sampling, model = self._request(messages, stop, kwargs, core)
        result = take_prefetched(prefetch_key(pieces, sampling, model))
        if result is None:
            (result,) = await core.arun([(pieces, sampling)], model)
        return _chat_result(result)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        core = self._core(run_manager)
        pieces, sampling, model = self._request(messages, stop, kwargs, core)
        for item in core.stream(pieces, sampling, model):
            chunk = _chunk(item)
            if run_manager and isinstance(item, str):
                run_manager.on_llm_new_token(item, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        core = self._core(run_manager)
        pieces, sampling, model = self._request(messages, stop, kwargs, core)
        async for item in core.astream(pieces, sampling, model):
            chunk = _chunk(item)
            if run_manager and isinstance(item, str):
                await run_manager.on_llm_new_token(item, chunk=chunk)
            yield chunk

    # -- batches: one group on the server ------------------------------------------------------

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Like BaseChatModel.batch, but every prompt reaches the server in one frame."""
        core = ModelCore(self, _batch_app(config))
        requests = self._batch_requests(inputs, kwargs, core)
        results: dict[PrefetchKey, list[Generated]] = {}
        if requests:
            with contextlib.suppress(Exception):  # each input then runs (and fails) on its own
                results = _table(requests, core.run(*_group(requests)))
        token = set_prefetched(results)
        try:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        finally:
            reset_prefetched(token)

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Async twin of :meth:`batch`."""
        core = ModelCore(self, _batch_app(config))
        requests = self._batch_requests(inputs, kwargs, core)
        results: dict[PrefetchKey, list[Generated]] = {}
        if requests:
            with contextlib.suppress(Exception):  # each input then runs (and fails) on its own
                results = _table(requests, await core.arun(*_group(requests)))
        token = set_prefetched(results)
        try:
            return await super().abatch(
                inputs, config, return_exceptions=return_exceptions, **kwargs
            )
        finally:
            reset_prefetched(token)

    def _batch_requests(
        self, inputs: list[LanguageModelInput], kwargs: dict[str, Any], core: ModelCore
    ) -> list[Request]:
        """The requests a batch will make, or [] when prefetching does not apply (a single
        input, or streaming, which goes through its own path), or when the server cannot be
        asked for its chat template (each input then runs, and fails, on its own)."""
        if len(inputs) < 2 or self.streaming or kwargs.get("stream"):
            return []
        call_kwargs = {k: v for k, v in kwargs.items() if k != "stop"}
        requests = []
        try:
            for item in inputs:
                messages = self._convert_input(item).to_messages()
                requests.append(self._request(messages, kwargs.get("stop"), call_kwargs, core))
        except Exception:  # as in batch: LangChain's per-input path reports it
            return []
        return requests

    # -- tokens ---------------------------------------------------------------------------

    def get_num_tokens(self, text: str) -> int:
        """Token count from the server's tokenizer (LangChain's default needs GPT-2 files)."""
        return ModelCore(self, None).count_tokens(text, self.model_name)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Tokens of the whole rendered chat prompt, generation prompt included."""
        template = ModelCore(self, None).chat_template(self.model_name)
        return self.get_num_tokens(concrete_text(self.prompt_pieces(messages, template)))


def _batch_app(config: RunnableConfig | list[RunnableConfig] | None) -> str | None:
    """The application a batch runs in: the root chain of its callers' runs, so the batch
    uses the same pooled session its inputs' single calls would (pure lookup)."""
    first = config[0] if isinstance(config, list) and config else config
    callbacks = first.get("callbacks") if isinstance(first, dict) else None
    return TRACER.app_of(getattr(callbacks, "parent_run_id", None))


def _group(requests: list[Request]) -> tuple[list[tuple[list[Piece], SamplingParams]], str | None]:
    """A batch's requests as ModelCore.run's arguments: (pieces, sampling) pairs and the
    model (a batch shares its call kwargs, hence its model). Pure."""
    return [(pieces, sampling) for pieces, sampling, _ in requests], requests[0][2]


def _table(
    requests: list[Request], generated: list[Generated]
) -> dict[PrefetchKey, list[Generated]]:
    """Results by request identity; equal requests queue their results in order (pure)."""
    table: dict[PrefetchKey, list[Generated]] = {}
    for (pieces, sampling, model), result in zip(requests, generated, strict=True):
        table.setdefault(prefetch_key(pieces, sampling, model), []).append(result)
    return table


def _chat_result(result: Generated) -> ChatResult:
    message = message_of(result)
    return ChatResult(
        generations=[ChatGeneration(message=message)],
        llm_output={"model_name": result.model_name},
    )


def _chunk(item: str | Generated) -> ChatGenerationChunk:
    """A text delta, or the closing chunk carrying usage and metadata."""
    if isinstance(item, str):
        return ChatGenerationChunk(message=AIMessageChunk(content=item))
    message = AIMessageChunk(
        content="",
        usage_metadata=usage_of(item),
        response_metadata=metadata_of(item),
        chunk_position="last",
    )
    info = {"finish_reason": item.finish_reason}
    return ChatGenerationChunk(message=message, generation_info=info)
