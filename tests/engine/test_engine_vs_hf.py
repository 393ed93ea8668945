"""Greedy output token-identical to transformers on the tiny preset, through every engine
path: batching, prefix hits, cascade decode, chunked prefill, preemption by recompute."""

from __future__ import annotations

import contextlib
import os
import random

import pytest
import torch

from eclectus.kernels import native
from eclectus.kernels.dispatch import force_backend
from eclectus.models.presets import resolve_model_dir
from eclectus.models.tiny_chat import BOS_ID, PAD_ID
from eclectus.server.engine import LLM, EngineConfig, SamplingParams

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 12
BOS = BOS_ID
MiB = 1 << 20


def random_prompt(rng: random.Random, length: int, prefix: list[int] | None = None) -> list[int]:
    head = prefix if prefix is not None else [BOS]
    return head + [rng.randrange(32, 127) for _ in range(length - len(head))]


@pytest.fixture(scope="module")
def hf_greedy() -> object:
    """A memoised reference: prompt ids -> transformers' greedy continuation."""
    model_dir = resolve_model_dir("tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    memo: dict[tuple[int, ...], list[int]] = {}

    def run(prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in memo:
            ids = torch.tensor([prompt])
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=MAX_TOKENS,
                    pad_token_id=PAD_ID,
                )
            memo[key] = out[0, len(prompt) :].tolist()
        return memo[key]

    return run


def engine(**overrides: object) -> LLM:
    return LLM(config=EngineConfig(model="tiny", kv_cache_bytes=16 * MiB).replace(**overrides))


def check(llm: LLM, hf_greedy: object, prompts: list[list[int]]) -> list[object]:
    outs = llm.generate(
        prompt_token_ids=prompts, sampling_params=SamplingParams(max_tokens=MAX_TOKENS)
    )
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(prompt), f"prompt of {len(prompt)} tokens diverged"
    return outs


def test_single_and_mixed_batch(hf_greedy: object) -> None:
    rng = random.Random(0)
    prompts = [random_prompt(rng, n) for n in (3, 17, 40, 95)]
    llm = engine(enable_prefix_caching=False)
    for prompt in prompts:
        check(llm, hf_greedy, [prompt])
    check(llm, hf_greedy, prompts)


@pytest.mark.parametrize("backend", ["torch", ""])
def test_shared_prefixes_hit_cache_and_match(
    hf_greedy: object, backend: str, backend_choice: contextlib.ExitStack
) -> None:
    """torch: > 64 shared tokens, so decode goes through the cascade path; auto: the native
    CPU kernel where it builds (whose thresholds leave 4 requests ungrouped)."""
    backend_choice.enter_context(force_backend(backend))
    rng = random.Random(1)
    shared = random_prompt(rng, 90)
    prompts = [random_prompt(rng, 90 + n, shared) for n in (1, 7, 20, 33)]
    llm = engine()
    check(llm, hf_greedy, prompts[:1])
    outs = check(llm, hf_greedy, prompts)
    assert all(o.num_cached_tokens >= 80 for o in outs[1:])
    assert llm.engine.stats().cache_hit_tokens >= 4 * 80


def test_chunked_prefill_tiny_budget(hf_greedy: object) -> None:
    rng = random.Random(2)
    prompts = [random_prompt(rng, n) for n in (70, 33, 5)]
    llm = engine(max_num_batched_tokens=32, enable_prefix_caching=False)
    check(llm, hf_greedy, prompts)
    assert llm.engine.counters.num_steps > MAX_TOKENS + 70 // 32


def test_forced_preemption(hf_greedy: object) -> None:
    rng = random.Random(3)
    prompts = [random_prompt(rng, n) for n in (40, 45, 50, 38)]
    llm = engine(num_kv_blocks=10)  # 160 slots for ~230 tokens in flight
    check(llm, hf_greedy, prompts)
    stats = llm.engine.stats()
    assert stats.num_preemptions > 0
    assert stats.num_free_blocks == stats.num_total_blocks  # nothing leaked


def test_string_prompts_are_tokenized_as_transformers_does(hf_greedy: object) -> None:
    """A string prompt's ids are transformers' ``tokenizer(text)`` (BOS first), and greedy
    decoding from them is HF's."""
    llm = engine()
    tokenizer = llm.tokenizer
    (out,) = llm.generate(["You are terse. Say hi."], SamplingParams(max_tokens=MAX_TOKENS))
    ids = tokenizer.encode("You are terse. Say hi.")
    assert out.prompt_token_ids == ids and ids[0] == tokenizer.bos_token_id
    assert out.token_ids == hf_greedy(ids)
    assert out.text == tokenizer.decode(
        [t for t in out.token_ids if t not in tokenizer.eos_token_ids]
    )


def test_common_1k_prefix_is_prefilled_once(hf_greedy: object) -> None:
    rng = random.Random(4)
    shared = random_prompt(rng, 1024)
    prompts = [random_prompt(rng, 1044, shared) for _ in range(8)]
    llm = engine()
    outs = llm.generate(
        prompt_token_ids=prompts, sampling_params=SamplingParams(max_tokens=MAX_TOKENS)
    )
    counters = llm.engine.counters
    assert counters.prefill_tokens == 1024 + 8 * 20  # the prefix once, every suffix once
    assert counters.cache_hit_tokens == 7 * 1024
    assert [o.num_cached_tokens for o in outs] == [0] + [1024] * 7
    for prompt, out in list(zip(prompts, outs, strict=True))[:2]:
        assert out.token_ids == hf_greedy(prompt)


@pytest.mark.skipif(not native.available(), reason="no working C compiler")
def test_suffix_prefills_over_a_shared_prefix_attend_as_decode_rows(hf_greedy: object) -> None:
    """Eight requests admitted on the prefix-cache hits of a ninth's 320 tokens prefill their
    own 10 tokens as decode rows in one cascade group (the shared blocks read once for all
    80 rows): token-identical to transformers, and to the chunked SDPA path."""
    rng = random.Random(7)
    shared = random_prompt(rng, 320)
    prompts = [random_prompt(rng, 330, shared) for _ in range(9)]
    outs = {}
    for rows in (True, False):
        llm = engine()
        if not rows:
            llm.engine.runner.max_row_prefill_tokens = 0
        outs[rows] = [o.token_ids for o in check(llm, hf_greedy, prompts)]
        assert llm.engine.counters.prefill_tokens == 320 + 9 * 10
        assert llm.engine.runner.num_row_prefill_tokens == (8 * 10 if rows else 0)
    assert outs[True] == outs[False]


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="the Triton kernels need CUDA or TRITON_INTERPRET=1 (set by `make test`)",
)
def test_triton_kernels_match(hf_greedy: object, backend_choice: contextlib.ExitStack) -> None:
    pytest.importorskip("triton")
    backend_choice.enter_context(force_backend("triton"))
    rng = random.Random(6)
    shared = random_prompt(rng, 80)  # two decodes share 5 blocks: the cascade kernel runs
    prompts = [random_prompt(rng, 83, shared), random_prompt(rng, 89, shared), [BOS, 70, 71]]
    llm = engine(num_kv_blocks=64, max_num_batched_tokens=64)  # chunked prefill too
    check(llm, hf_greedy, prompts)
