"""Triton kernels against the references: under TRITON_INTERPRET=1 on CPU, or on a GPU.

fp32 tightly, bf16 loosely. Small shapes: the interpreter runs every program in numpy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import PagedBatch, make_batch, nested_batch

from eclectus.kernels import (
    HAS_TRITON,
    DecodePlan,
    build_decode_plan,
    cascade_decode_attention,
    decode_attention,
    merge_attention_states,
    paged_decode_attention,
    plan_prefill,
    prefill_attention,
    ref_merge_attention_states,
    ref_paged_decode,
    ref_prefill,
)
from eclectus.kernels.dispatch import force_backend

RUNNABLE = HAS_TRITON and (os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available())
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="needs triton and TRITON_INTERPRET=1 or CUDA")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
Case = tuple[PagedBatch, int, int, torch.dtype]  # batch, num_q_heads, head_dim, dtype
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


@pytest.fixture(autouse=True)
def _triton_backend() -> Iterator[None]:
    with force_backend("triton"):
        yield


def _on_device(batch: PagedBatch) -> PagedBatch:
    """Moves the caches to DEVICE (mutates and returns ``batch``)."""
    batch.k_cache, batch.v_cache = batch.k_cache.to(DEVICE), batch.v_cache.to(DEVICE)
    return batch


def _queries(
    num: int, num_q_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 1
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num, num_q_heads, head_dim, generator=gen).to(DEVICE, dtype)


def _assert_matches_reference(
    q: torch.Tensor,
    batch: PagedBatch,
    plan: DecodePlan,
    scale: float,
    dtype: torch.dtype,
    cascade: bool,
) -> None:
    run = cascade_decode_attention if cascade else paged_decode_attention
    o, lse = run(q, batch.k_cache, batch.v_cache, plan, scale)
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, scale
    )
    assert o.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(o.float(), o_ref.float(), **TOL[dtype])
    torch.testing.assert_close(lse, lse_ref, **TOL[dtype])


@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim", "dtype"),
    [(4, 2, 64, torch.float32), (2, 1, 128, torch.float32), (8, 2, 64, torch.bfloat16)],
)
def test_paged_decode_ragged_gqa(
    num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    batch = _on_device(
        nested_batch(block_size=4, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)
    )
    q = _queries(len(batch.seq_lens), num_q_heads, head_dim, dtype)
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, DEVICE, cascade=False)
    _assert_matches_reference(q, batch, plan, 1 / math.sqrt(head_dim), dtype, cascade=False)


@pytest.mark.parametrize(
    ("min_tokens", "head_dim", "dtype"),
    [(4, 32, torch.float32), (16, 128, torch.float32), (4, 64, torch.bfloat16)],
)
def test_cascade_nested_levels_equal_paged_attention(
    min_tokens: int, head_dim: int, dtype: torch.dtype
) -> None:
    """Several groups over three levels, an empty suffix, an ungrouped request."""
    batch = _on_device(nested_batch(block_size=4, num_kv_heads=2, head_dim=head_dim, dtype=dtype))
    q = _queries(len(batch.seq_lens), 4, head_dim, dtype)
    plan = build_decode_plan(
        batch.block_tables, batch.seq_lens, 4, DEVICE, min_shared_tokens=min_tokens
    )
    assert plan.cascade is not None and plan.cascade.num_levels >= 2
    _assert_matches_reference(q, batch, plan, 0.2, dtype, cascade=True)
    o_plain, _ = paged_decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.2)
    torch.testing.assert_close(
        decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.2).float(),
        o_plain.float(),
        **TOL[dtype],
    )


def test_cascade_group_larger_than_one_query_tile() -> None:
    """40 requests x 4 heads = 160 stacked rows: two 128-row tiles over the same prefix."""
    batch = _on_device(
        make_batch(
            [("p",)] * 40,
            {"p": 37},
            [i % 5 for i in range(40)],
            block_size=8,
            num_kv_heads=1,
            head_dim=16,
        )
    )
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 8, DEVICE, min_shared_tokens=8)
    assert plan.cascade is not None and plan.cascade.max_group_size == 40
    _assert_matches_reference(
        _queries(40, 4, 16, torch.float32), batch, plan, 0.25, torch.float32, cascade=True
    )


def test_cascade_with_every_suffix_empty() -> None:
    batch = _on_device(
        make_batch([("p",)] * 3, {"p": 16}, [0, 0, 0], block_size=8, num_kv_heads=1, head_dim=16)
    )
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 8, DEVICE, min_shared_tokens=8)
    assert plan.cascade is not None and plan.cascade.suffix_starts == (16, 16, 16)
    _assert_matches_reference(
        _queries(3, 4, 16, torch.float32), batch, plan, 0.25, torch.float32, cascade=True
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_chunked_over_paged_prefix(dtype: torch.dtype) -> None:
    """Cached context not aligned to blocks, a one-token chunk, an empty chunk, a long prompt."""
    batch = _on_device(
        make_batch(
            [("a",), ("a",), ("b",), ()],
            {"a": 6, "b": 3},
            [5, 1, 4, 70],
            block_size=4,
            num_kv_heads=2,
            head_dim=16,
            dtype=dtype,
        )
    )
    query_lens = [5, 1, 0, 70]
    plan = plan_prefill(batch.block_tables, query_lens, batch.seq_lens, 4, DEVICE)
    q = _queries(sum(query_lens), 4, 16, dtype)
    o = prefill_attention(q, batch.k_cache, batch.v_cache, plan, 0.25)
    o_ref, _ = ref_prefill(
        q, batch.k_cache, batch.v_cache, batch.block_tables, query_lens, batch.seq_lens, 0.25
    )
    assert o.dtype == dtype
    torch.testing.assert_close(o.float(), o_ref.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_kernel_matches_reference_with_empty_sides(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    o_a, o_b = torch.randn(4, 3, 24, generator=gen), torch.randn(4, 3, 24, generator=gen)
    lse_a, lse_b = torch.randn(4, 3, generator=gen) * 30, torch.randn(4, 3, generator=gen)
    lse_a[0], lse_b[0, :2], lse_b[1] = -math.inf, -math.inf, -math.inf
    args = [o_a.to(DEVICE, dtype), lse_a.to(DEVICE), o_b.to(DEVICE, dtype), lse_b.to(DEVICE)]
    o, lse = merge_attention_states(*args)
    o_ref, lse_ref = ref_merge_attention_states(*args)
    assert o.dtype == dtype
    torch.testing.assert_close(o.float(), o_ref.float(), **TOL[dtype])
    torch.testing.assert_close(lse, lse_ref)
    assert lse[0, 0].item() == -math.inf and torch.equal(o[0, 0], torch.zeros_like(o[0, 0]))


@st.composite
def shared_batches(draw: st.DrawFn) -> Case:
    """A random prefix forest: each request picks a path of nested segments and a tail.
    Returns (batch, num_q_heads, head_dim, dtype)."""
    block_size = draw(st.sampled_from([2, 3, 4, 8, 16]))
    seg = st.integers(1, 24)
    lens = {"s0": draw(seg), "s1": draw(seg), "a": draw(seg), "b": draw(seg), "c": draw(seg)}
    path = st.sampled_from(
        [("s0",), ("s0", "a"), ("s0", "a", "c"), ("s0", "b"), ("s1",), ("s1", "a"), ()]
    )
    num_requests = draw(st.integers(1, 6))
    paths = [draw(path) for _ in range(num_requests)]
    tails = [draw(st.integers(0 if p else 1, 9)) for p in paths]
    num_kv_heads, group = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([16, 32]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    batch = make_batch(
        paths,
        lens,
        tails,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        seed=draw(st.integers(0, 99)),
    )
    return _on_device(batch), num_kv_heads * group, head_dim, dtype


@settings(max_examples=15, deadline=None)
@given(case=shared_batches(), min_tokens=st.sampled_from([1, 8]))
def test_hypothesis_cascade_and_paged_match_reference(case: Case, min_tokens: int) -> None:
    batch, num_q_heads, head_dim, dtype = case
    q = _queries(len(batch.seq_lens), num_q_heads, head_dim, dtype)
    plan = build_decode_plan(
        batch.block_tables, batch.seq_lens, batch.block_size, DEVICE, min_shared_tokens=min_tokens
    )
    _assert_matches_reference(q, batch, plan, 0.3, dtype, cascade=False)
    if plan.cascade is not None:
        _assert_matches_reference(q, batch, plan, 0.3, dtype, cascade=True)


@settings(max_examples=10, deadline=None)
@given(case=shared_batches(), data=st.data())
def test_hypothesis_prefill_matches_reference(case: Case, data: st.DataObject) -> None:
    batch, num_q_heads, head_dim, dtype = case
    query_lens = [data.draw(st.integers(0, n)) for n in batch.seq_lens]
    plan = plan_prefill(batch.block_tables, query_lens, batch.seq_lens, batch.block_size, DEVICE)
    q = _queries(sum(query_lens), num_q_heads, head_dim, dtype)
    o = prefill_attention(q, batch.k_cache, batch.v_cache, plan, 0.3)
    o_ref, _ = ref_prefill(
        q, batch.k_cache, batch.v_cache, batch.block_tables, query_lens, batch.seq_lens, 0.3
    )
    torch.testing.assert_close(o.float(), o_ref.float(), **TOL[dtype])


@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_kv_partials_merge_exactly(num_splits: int) -> None:
    """Long shared prefix split over several programs (flash-decoding), for both passes."""
    from eclectus.kernels.triton_cascade import cascade_decode_triton
    from eclectus.kernels.triton_decode import paged_decode_triton

    batch = _on_device(
        make_batch(
            [("sys", "x"), ("sys", "y"), ("sys",)],
            {"sys": 300, "x": 70, "y": 5},
            [3, 140, 1],
            block_size=16,
            num_kv_heads=2,
            head_dim=16,
        )
    )
    q = _queries(3, 4, 16, torch.float32)
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 16, DEVICE)
    assert plan.cascade is not None
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25
    )
    o, lse = cascade_decode_triton(q, batch.k_cache, batch.v_cache, plan, 0.25, num_splits)
    torch.testing.assert_close(o, o_ref, **TOL[torch.float32])
    torch.testing.assert_close(lse, lse_ref, **TOL[torch.float32])
    o, lse = paged_decode_triton(q, batch.k_cache, batch.v_cache, plan, 0.25, num_splits=num_splits)
    torch.testing.assert_close(o, o_ref, **TOL[torch.float32])
    torch.testing.assert_close(lse, lse_ref, **TOL[torch.float32])
