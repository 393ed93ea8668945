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
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, ClassVar
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

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
    message_fields,
    message_role,
    render_chat,
)
from eclectus.adapters.langchain.pieces import Piece, concrete_text
from eclectus.adapters.langchain.tools import (
    ChunkReader,
    StructuredMethod,
    reply_parts,
    split_call_kwargs,
    structured_runnable,
    tool_choice_of,
)
from eclectus.adapters.langchain.tracing import TRACER, config_run_id
from eclectus.protocol import SamplingParams
from eclectus.protocol.openai_tools import ChatConstraint, with_constraint

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

    renders_chat: ClassVar[bool] = True  # prompts: the chat template's render

    extra_body: dict[str, Any] | None = None
    """vLLM's request extensions, as ChatOpenAI passes them: ``top_k``, ``ignore_eos``,
    ``structured_outputs`` (or ``guided_json``/``guided_regex``/``guided_choice``/
    ``guided_grammar``). A call's ``extra_body`` adds to it."""

    @property
    def _llm_type(self) -> str:
        return "eclectus-chat"

    # -- tools and structured output ------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (OpenAI tool schemas, LangChain tools, Pydantic classes, functions).
        ``tool_choice``: "auto" (default), "none", "required"/"any", a tool's name, True (the
        only tool) or OpenAI's ``{"type": "function", "function": {"name": ...}}``; required
        and named choices are enforced by the server's grammar, and every call's arguments
        are valid against its tool's schema. Pure (returns a bound runnable)."""
        formatted = [convert_to_openai_tool(t, strict=strict) for t in tools]
        bound: dict[str, Any] = {"tools": formatted, **kwargs}
        if tool_choice is not None:
            bound["tool_choice"] = tool_choice_of(tool_choice, formatted)
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(**bound)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: StructuredMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """A runnable whose output is ``schema``'s instance (a Pydantic object, else a dict).
        ``method``: "json_schema" (the reply is constrained to the schema), "function_calling"
        (one forced call of the schema as a tool) or "json_mode" (any JSON object). The
        server's grammar makes the JSON valid by construction. ``include_raw``: a dict with
        ``raw``, ``parsed`` and ``parsing_error``. Pure."""
        if kwargs:
            raise ValueError(f"unsupported arguments {sorted(kwargs)}")
        return structured_runnable(self.bind, self.bind_tools, schema, method, include_raw)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = self.ls_params(stop, kwargs)
        return LangSmithParams(ls_model_type="chat", **params)  # type: ignore[typeddict-item]

    # -- building one request --------------------------------------------------------------

    def prompt_pieces(
        self,
        messages: Sequence[BaseMessage],
        template: ChatTemplate = DEFAULT_TEMPLATE,
        tools: Sequence[dict[str, Any]] | None = None,
        run_id: UUID | None = None,
    ) -> list[Piece]:
        """The prompt for ``messages``, rendered with ``template`` (the served model's, see
        :meth:`_call`) and ``tools``; template boundaries the tracing hook saw in
        ``run_id``'s run tree become segment boundaries; an assistant turn's tool calls and
        a tool result's call id reach the template as its ``tool_calls`` / ``tool_call_id``,
        so it writes them in the model's own syntax. Pure apart from the lookup."""
        per_message = TRACER.message_pieces(messages, run_id)
        rendered = [
            (message_role(m), pieces, message_fields(m))
            for m, pieces in zip(messages, per_message, strict=True)
        ]
        return render_chat(rendered, template, tools)

    def _call(
        self,
        messages: Sequence[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        core: ModelCore,
        run_id: UUID | None,
    ) -> tuple[Request, ChatConstraint]:
        """One call's request, pieces (in the chat template ``core``'s server announces:
        connects on first use; the template boundaries seen in ``run_id``'s run tree),
        sampling payload (with the tools' or format's constraint) and model, and the
        constraint its reply is read with (the tools' calls in the syntax the server
        announces for the model)."""
        model = self.model_for(kwargs)
        template = core.chat_template(model)
        kwargs, constraint = split_call_kwargs(kwargs, self.extra_body, template.tool_format)
        pieces = self.prompt_pieces(messages, template, constraint.tools, run_id)
        # the constraint, and special tokens kept in a reply read for hermes calls, as /v1
        # and vLLM's hermes parser have them
        sampling = with_constraint(self.sampling(stop, kwargs), constraint)
        return (pieces, sampling, model), constraint

    def _core(self, run_manager: Any) -> ModelCore:
        return ModelCore(self, TRACER.app_of(_run_id(run_manager)))

    # -- LangChain's entry points ------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        core = self._core(run_manager)
        call = self._call(messages, stop, kwargs, core, _run_id(run_manager))
        return core.block(lambda: _answer(core, *call))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        core = self._core(run_manager)
        call = self._call(messages, stop, kwargs, core, _run_id(run_manager))
        return await _answer(core, *call)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        core = self._core(run_manager)
        call = self._call(messages, stop, kwargs, core, _run_id(run_manager))
        for chunk, is_token in core.iterate(_chat_chunks(core, *call)):
            if run_manager and is_token:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        core = self._core(run_manager)
        call = self._call(messages, stop, kwargs, core, _run_id(run_manager))
        async for chunk, is_token in _chat_chunks(core, *call):
            if run_manager and is_token:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
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
        core, requests = self._batch_requests(inputs, config, kwargs)
        with _prefetched(core.block(lambda: _prefetch(core, requests))):
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Like BaseChatModel.abatch, but every prompt reaches the server in one frame."""
        core, requests = self._batch_requests(inputs, config, kwargs)
        with _prefetched(await _prefetch(core, requests)):
            return await super().abatch(
                inputs, config, return_exceptions=return_exceptions, **kwargs
            )

    def _batch_requests(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None,
        kwargs: dict[str, Any],
    ) -> tuple[ModelCore, list[Request]]:
        """The core of a batch, in the application its config's run belongs to, and the
        requests the batch will make (each input's run nests in the run its config names),
        or [] when prefetching does not apply (a single input, or streaming, which goes
        through its own path), or when the server cannot be asked for its chat template
        (each input then runs, and fails, on its own). Blocking: connects on first use."""
        core = ModelCore(self, TRACER.app_of(config_run_id(config)))
        if len(inputs) < 2 or self.streaming or kwargs.get("stream"):
            return core, []
        call_kwargs = {k: v for k, v in kwargs.items() if k != "stop"}
        requests = []
        try:
            for item, run_id in zip(inputs, _run_ids(config, len(inputs)), strict=True):
                messages = self._convert_input(item).to_messages()
                stop = kwargs.get("stop")
                request, _ = self._call(messages, stop, call_kwargs, core, run_id)
                requests.append(request)
        except Exception:  # as in batch: LangChain's per-input path reports it
            return core, []
        return core, requests

    # -- tokens ---------------------------------------------------------------------------

    def get_num_tokens(self, text: str) -> int:
        """Token count from the server's tokenizer (LangChain's default needs GPT-2 files)."""
        return ModelCore(self, None).count_tokens(text, self.model_name)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Tokens of the whole rendered chat prompt, generation prompt included."""
        template = ModelCore(self, None).chat_template(self.model_name)
        formatted = [convert_to_openai_tool(t) for t in tools or ()]
        pieces = self.prompt_pieces(messages, template, formatted or None)
        return self.get_num_tokens(concrete_text(pieces))


def _run_ids(config: RunnableConfig | list[RunnableConfig] | None, count: int) -> list[UUID | None]:
    """The run each of a batch's ``count`` inputs nests in (its config's parent run): the
    tree whose templates its single call will see, so the prefetched request matches (pure).
    """
    if isinstance(config, list) and len(config) == count:
        return [config_run_id(c) for c in config]
    return [config_run_id(config)] * count


def _run_id(run_manager: Any) -> UUID | None:
    """The model run's id (None when called without callbacks)."""
    return getattr(run_manager, "run_id", None)


async def _answer(core: ModelCore, request: Request, constraint: ChatConstraint) -> ChatResult:
    """One call's result: the one its batch prefetched, else asked for now."""
    pieces, sampling, model = request
    result = take_prefetched(prefetch_key(pieces, sampling, model))
    if result is None:
        (result,) = await core.arun([(pieces, sampling)], model)
    return _chat_result(result, constraint)


async def _chat_chunks(
    core: ModelCore, request: Request, constraint: ChatConstraint
) -> AsyncIterator[tuple[ChatGenerationChunk, bool]]:
    """One call's chunks, each with whether it is a new token for ``on_llm_new_token``."""
    reader = ChunkReader(constraint)
    async for item in core.astream(*request):
        for chunk in _chunks(item, reader):
            yield chunk, isinstance(item, str)


async def _prefetch(core: ModelCore, requests: list[Request]) -> dict[PrefetchKey, list[Generated]]:
    """A batch's results by request identity, asked for as one group; {} when there is
    nothing to prefetch or the group fails (each input then runs, and fails, on its own)."""
    if not requests:
        return {}
    with contextlib.suppress(Exception):
        return _table(requests, await core.arun(*_group(requests)))
    return {}


@contextlib.contextmanager
def _prefetched(results: dict[PrefetchKey, list[Generated]]) -> Iterator[None]:
    """Offers ``results`` to the single calls run inside (mutates the context's table)."""
    token = set_prefetched(results)
    try:
        yield
    finally:
        reset_prefetched(token)


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


def _chat_result(result: Generated, constraint: ChatConstraint | None = None) -> ChatResult:
    message = message_of(result)
    if constraint is not None and constraint.parse_tool_calls:
        content, calls = reply_parts(result.text, constraint)
        if calls:
            metadata = {**metadata_of(result), "finish_reason": "tool_calls"}
            message = AIMessage(
                content=content,
                tool_calls=calls,
                usage_metadata=usage_of(result),
                response_metadata=metadata,
            )
    return ChatResult(
        generations=[ChatGeneration(message=message)],
        llm_output={"model_name": result.model_name},
    )


def _chunks(item: str | Generated, reader: ChunkReader) -> list[ChatGenerationChunk]:
    """The chunks of one streamed item: text and tool-call chunks as the reader completes
    them, then (for the closing record) what it held back and the closing chunk."""
    pieces = reader.feed(item) if isinstance(item, str) else reader.finish()
    out = [
        ChatGenerationChunk(message=AIMessageChunk(content=text, tool_call_chunks=calls))
        for text, calls in pieces
        if text or calls
    ]
    if not isinstance(item, str):
        last = _chunk(item)
        if reader.num_calls:
            last.message.response_metadata["finish_reason"] = "tool_calls"
            last.generation_info = {"finish_reason": "tool_calls"}
        out.append(last)
    return out


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
