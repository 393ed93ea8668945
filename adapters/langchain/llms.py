"""EclectusLLM: a drop-in LangChain completion model (for ``OpenAI`` / ``VLLMOpenAI``).

A batch of prompts (``generate``, ``batch``) reaches the server as one group in one frame.
Inside a chain, the prompt template's boundaries become segment boundaries (tracing.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM, LanguageModelInput
from langchain_core.language_models.llms import LangSmithParams
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.runnables import Runnable

from eclectus.adapters.langchain._calls import ModelCore
from eclectus.adapters.langchain._client import Generated
from eclectus.adapters.langchain._common import EclectusParams
from eclectus.adapters.langchain.llm_structured import completion_structured_runnable
from eclectus.adapters.langchain.pieces import Piece
from eclectus.adapters.langchain.tracing import TRACER
from eclectus.protocol import SamplingParams

# each prompt's own run, while LangChain runs ``_generate`` for a group of prompts
_PROMPT_RUNS: ContextVar[list[UUID] | None] = ContextVar("eclectus_prompt_runs", default=None)


@contextlib.contextmanager
def _prompt_runs(run_managers: Sequence[Any]) -> Iterator[None]:
    """Each prompt's run id in _PROMPT_RUNS for the block (mutates the context variable;
    reset on leaving)."""
    token = _PROMPT_RUNS.set([m.run_id for m in run_managers])
    try:
        yield
    finally:
        _PROMPT_RUNS.reset(token)


def info_of(result: Generated) -> dict[str, Any]:
    """generation_info of one finished call (pure)."""
    return {
        "finish_reason": result.finish_reason,
        "model_name": result.model_name,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
    }


def llm_result(results: list[Generated]) -> LLMResult:
    """One LLMResult for a group of finished calls, with summed token usage (pure)."""
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return LLMResult(
        generations=[[Generation(text=r.text, generation_info=info_of(r))] for r in results],
        llm_output={
            "token_usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
            "model_name": results[0].model_name if results else None,
        },
    )


class EclectusLLM(EclectusParams, BaseLLM):
    """Completion model on an Eclectus server (a drop-in for ``OpenAI``/``VLLMOpenAI``).

    Example:
        ```python
        from eclectus.adapters.langchain import EclectusLLM

        llm = EclectusLLM(model="tiny", base_url="ws://127.0.0.1:8765", max_tokens=32)
        llm.invoke("Once upon a time")
        ```
    """

    @property
    def _llm_type(self) -> str:
        return "eclectus"

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: str = "json_schema",
        include_raw: bool = False,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """A runnable whose output is ``schema``'s instance (a Pydantic object, else a
        dict), as ChatEclectus's: ``schema`` is a Pydantic class, a TypedDict or a JSON
        Schema dict. ``method``: "json_schema" (the completion is constrained to the
        schema) or "json_mode" (to the schema when given, else to any JSON object); the
        server's grammar makes the JSON valid by construction (LangChain's BaseLLM has no
        structured output at all). ``include_raw``: a dict with ``raw`` (the text),
        ``parsed`` and ``parsing_error``. Pure."""
        if kwargs:
            raise ValueError(f"unsupported arguments {sorted(kwargs)}")
        return completion_structured_runnable(self.bind, schema, method, include_raw)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = self.ls_params(stop, kwargs)
        return LangSmithParams(ls_model_type="llm", **params)  # type: ignore[typeddict-item]

    @staticmethod
    def prompt_pieces(prompt: str, run_id: UUID | None = None) -> list[Piece]:
        """The prompt as pieces: its template's boundaries when the tracing hook saw them in
        ``run_id``'s run tree (pure lookup)."""
        return TRACER.pieces_for(prompt, run_id) or [prompt]

    def _requests(
        self,
        prompts: list[str],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        run_manager: Any,
    ) -> tuple[list[tuple[list[Piece], SamplingParams]], str | None]:
        sampling = self.sampling(stop, kwargs)
        run_ids = _PROMPT_RUNS.get()
        if run_ids is None or len(run_ids) != len(prompts):
            run_ids = [getattr(run_manager, "run_id", None)] * len(prompts)
        pieces = [self.prompt_pieces(p, r) for p, r in zip(prompts, run_ids, strict=True)]
        return [(p, sampling) for p in pieces], self.model_for(kwargs)

    # LangChain gives ``_generate`` only the first prompt's run manager; a chain's batch
    # runs each prompt in its own run tree, whose templates only that prompt's run sees.
    def _generate_helper(
        self,
        prompts: list[str],
        stop: list[str] | None,
        run_managers: list[CallbackManagerForLLMRun],
        **kwargs: Any,
    ) -> LLMResult:
        with _prompt_runs(run_managers):
            return super()._generate_helper(prompts, stop, run_managers, **kwargs)

    async def _agenerate_helper(
        self,
        prompts: list[str],
        stop: list[str] | None,
        run_managers: list[AsyncCallbackManagerForLLMRun],
        **kwargs: Any,
    ) -> LLMResult:
        with _prompt_runs(run_managers):
            return await super()._agenerate_helper(prompts, stop, run_managers, **kwargs)

    def _core(self, run_manager: Any) -> ModelCore:
        return ModelCore(self, TRACER.app_of(getattr(run_manager, "run_id", None)))

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        requests, model = self._requests(prompts, stop, kwargs, run_manager)
        core = self._core(run_manager)
        return llm_result(core.block(lambda: core.arun(requests, model)))

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        requests, model = self._requests(prompts, stop, kwargs, run_manager)
        return llm_result(await self._core(run_manager).arun(requests, model))

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        ((pieces, sampling),), model = self._requests([prompt], stop, kwargs, run_manager)
        core = self._core(run_manager)
        for item in core.iterate(core.astream(pieces, sampling, model)):
            chunk = _chunk(item)
            if run_manager and isinstance(item, str):
                run_manager.on_llm_new_token(item, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        ((pieces, sampling),), model = self._requests([prompt], stop, kwargs, run_manager)
        async for item in self._core(run_manager).astream(pieces, sampling, model):
            chunk = _chunk(item)
            if run_manager and isinstance(item, str):
                await run_manager.on_llm_new_token(item, chunk=chunk)
            yield chunk

    def get_num_tokens(self, text: str) -> int:
        """Token count from the server's tokenizer (LangChain's default needs GPT-2 files)."""
        return ModelCore(self, None).count_tokens(text, self.model_name)


def _chunk(item: str | Generated) -> GenerationChunk:
    if isinstance(item, str):
        return GenerationChunk(text=item)
    return GenerationChunk(text="", generation_info=info_of(item))
