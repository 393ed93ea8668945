"""What a stock stack answers, for the same-answers tests: transformers' tokenizer and greedy
``generate`` on the embedded ``tiny`` model's Hugging Face directory (the files vLLM loads)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import transformers

from eclectus.models.presets import resolve_model_dir
from eclectus.models.tiny_chat import PAD_ID


@functools.cache
def hf_tokenizer() -> Any:
    return transformers.AutoTokenizer.from_pretrained(resolve_model_dir("tiny"))


@functools.cache
def hf_model() -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        resolve_model_dir("tiny"), dtype=torch.float32
    )
    return model.eval()


@functools.lru_cache(maxsize=512)
def greedy_ids(prompt_ids: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    """transformers' greedy continuation of ``prompt_ids`` (EOS included when it stops)."""
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = hf_model().generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_tokens,
            pad_token_id=PAD_ID,
        )
    return tuple(out[0, len(prompt_ids) :].tolist())


def greedy_text(prompt_ids: Sequence[int], max_tokens: int) -> str:
    """The text of that continuation, special tokens (EOS) skipped, as a server returns it."""
    generated = greedy_ids(tuple(prompt_ids), max_tokens)
    return hf_tokenizer().decode(list(generated), skip_special_tokens=True)


def complete(text: str, max_tokens: int) -> str:
    """A completion prompt, the stock way: ``tokenizer(text)`` (BOS first), greedy."""
    return greedy_text(hf_tokenizer()(text).input_ids, max_tokens)


def chat(messages: Sequence[Mapping[str, str]], max_tokens: int) -> str:
    """A chat prompt, the stock way: ``apply_chat_template`` (no special token added beyond
    the template's, as vLLM's chat endpoint), greedy."""
    ids = hf_tokenizer().apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return greedy_text(list(ids), max_tokens)
