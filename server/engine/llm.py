"""The offline API, like vLLM's: ``LLM("tiny").generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm_engine import LLMEngine


@dataclass(slots=True)
class RequestOutput:
    """The finished result of one prompt."""

    request_id: str
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated ids (a final EOS or stop token included)
    finish_reason: str | None  # "stop" | "length"
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


class LLM:
    """A synchronous engine for batch generation in one process (mutates its engine)."""

    def __init__(
        self, model: str = "tiny", config: EngineConfig | None = None, **overrides: Any
    ) -> None:
        base = config if config is not None else EngineConfig(model=model)
        self.engine = LLMEngine(base.replace(**overrides) if overrides else base)
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (strings, tokenized as ``tokenizer(text)`` does, BOS
        as the tokenizer config says; or ``prompt_token_ids``) and return the outputs in
        prompt order. One SamplingParams for all, or one per prompt."""
        items = self._tokenize(prompts, prompt_token_ids)
        params = sampling_params if sampling_params is not None else SamplingParams()
        per_prompt = [params] * len(items) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(items):
            raise ValueError(f"{len(per_prompt)} sampling params for {len(items)} prompts")
        outputs: dict[str, RequestOutput] = {}
        for (prompt, ids), sp in zip(items, per_prompt, strict=True):
            request_id = f"llm-{next(self._ids)}"
            self.engine.add_tokens(request_id, ids, sp)
            outputs[request_id] = RequestOutput(request_id, prompt, list(ids), "", [], None)
        self._run(outputs)
        return list(outputs.values())

    def _tokenize(
        self,
        prompts: str | Sequence[str] | None,
        prompt_token_ids: Sequence[Sequence[int]] | None,
    ) -> list[tuple[str | None, list[int]]]:
        if prompt_token_ids is not None:
            return [(None, list(ids)) for ids in prompt_token_ids]
        if prompts is None:
            raise ValueError("give prompts or prompt_token_ids")
        if isinstance(prompts, str):
            prompts = [prompts]
        return [(prompt, self.engine.tokenizer.encode(prompt)) for prompt in prompts]

    def _run(self, outputs: dict[str, RequestOutput]) -> None:
        """Step until every request finished, folding deltas into ``outputs`` (mutates)."""
        while self.engine.has_unfinished:
            for delta in self.engine.step():
                result = outputs.get(delta.request_id)
                if result is None:  # not ours (should not happen in the offline API)
                    continue
                result.text += delta.text
                result.token_ids += delta.token_ids
                result.num_cached_tokens = delta.num_cached_tokens
                if delta.finished:
                    result.finish_reason = delta.finish_reason
