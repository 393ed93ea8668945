"""The torch paths the dispatchers run on CPU, against the looped references."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import make_batch, nested_batch

from eclectus.kernels import (
    build_decode_plan,
    cascade_decode_attention,
    decode_attention,
    merge_attention_states,
    paged_decode_attention,
    plan_prefill,
    prefill_attention,
    ref_attention,
    ref_merge_attention_states,
    ref_paged_decode,
    ref_prefill,
    store_kv,
    torch_ops,
)
from eclectus.kernels.dispatch import force_backend

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _torch_backend() -> Iterator[None]:
    with force_backend("torch"):
        yield


def _queries(batch: int, num_q_heads: int, head_dim: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, num_q_heads, head_dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("num_q_heads", "num_kv_heads", "head_dim"), [(4, 2, 64), (8, 8, 16)])
def test_paged_decode_matches_reference(num_q_heads: int, num_kv_heads: int, head_dim: int) -> None:
    batch = nested_batch(block_size=4, num_kv_heads=num_kv_heads, head_dim=head_dim)
    q = _queries(len(batch.seq_lens), num_q_heads, head_dim)
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, CPU, cascade=False)
    o, lse = paged_decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.3)
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.3
    )
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("min_tokens", [4, 16])
def test_cascade_equals_paged_attention_over_concatenated_kv(min_tokens: int) -> None:
    """Nested levels, several groups, an empty suffix, an ungrouped request."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=32)
    q = _queries(len(batch.seq_lens), 6, 32)
    plan = build_decode_plan(
        batch.block_tables, batch.seq_lens, 4, CPU, min_shared_tokens=min_tokens
    )
    assert plan.cascade is not None
    o, lse = cascade_decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.2)
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.2
    )
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.2), o)


def test_cascade_with_all_suffixes_empty_and_bf16() -> None:
    batch = make_batch(
        [("p",)] * 3,
        {"p": 12},
        [0, 0, 0],
        block_size=4,
        num_kv_heads=1,
        head_dim=16,
        dtype=torch.bfloat16,
    )
    q = _queries(3, 2, 16).bfloat16()
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, CPU, min_shared_tokens=4)
    assert plan.cascade is not None
    o, _ = cascade_decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.25)
    o_ref, _ = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25
    )
    assert o.dtype == torch.bfloat16
    torch.testing.assert_close(o.float(), o_ref.float(), atol=2e-2, rtol=2e-2)


def test_merge_of_two_halves_is_attention_over_the_union() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(5, 4, 8, generator=gen),
        torch.randn(9, 2, 8, generator=gen),
        torch.randn(9, 2, 8, generator=gen),
    )
    o_all, lse_all = ref_attention(q, k, v, 0.5)
    o_a, lse_a = ref_attention(q, k[:4], v[:4], 0.5)
    o_b, lse_b = ref_attention(q, k[4:], v[4:], 0.5)
    o, lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(o, o_all, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_all, atol=1e-5, rtol=1e-5)


def test_merge_handles_empty_sides_and_huge_lse() -> None:
    o_a, o_b = torch.ones(2, 1, 3), torch.full((2, 1, 3), 2.0)
    lse_a = torch.tensor([[-math.inf], [1000.0]])
    lse_b = torch.tensor([[-math.inf], [-math.inf]])
    o, lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert torch.equal(o[0], torch.zeros(1, 3)) and lse[0].item() == -math.inf
    assert torch.equal(o[1], o_a[1]) and lse[1].item() == 1000.0
    o_ref, lse_ref = ref_merge_attention_states(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(lse, lse_ref)


@pytest.mark.parametrize(
    ("query_lens", "num_q_heads"),
    [([5, 1, 0, 9], 4), ([11, 2, 7, 3], 2), ([6, 1, 4, 9], 4), ([6, 7, 4, 10], 2)],
)
def test_prefill_matches_reference(query_lens: list[int], num_q_heads: int) -> None:
    """Chunked prefill over cached blocks, a one-token chunk, an empty chunk, a full prompt;
    chunks longer than their cached context (2 * query_len > seq_len: the padded causal
    path) and shorter ones (the explicit-mask path)."""
    batch = make_batch(
        [("a",), ("a",), ("b",), ()],
        {"a": 6, "b": 3},
        [5, 1, 4, 11],
        block_size=4,
        num_kv_heads=2,
        head_dim=16,
    )
    plan = plan_prefill(batch.block_tables, query_lens, batch.seq_lens, 4, CPU)
    q = torch.randn(sum(query_lens), num_q_heads, 16, generator=torch.Generator().manual_seed(4))
    o = prefill_attention(q, batch.k_cache, batch.v_cache, plan, 0.25)
    o_ref, _ = ref_prefill(
        q, batch.k_cache, batch.v_cache, batch.block_tables, query_lens, batch.seq_lens, 0.25
    )
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)


def test_store_kv_writes_slots() -> None:
    """Slot s lands in block s // block_size at offset s % block_size, every kv head."""
    k_cache, v_cache = torch.zeros(3, 2, 4, 8), torch.zeros(3, 2, 4, 8)  # [N, Hkv, bs, D]
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    store_kv(k, v, k_cache, v_cache, torch.tensor([9, 2, 4]))
    expected_k, expected_v = torch.zeros(3, 2, 4, 8), torch.zeros(3, 2, 4, 8)
    for (block, slot), k_row, v_row in zip([(2, 1), (0, 2), (1, 0)], k, v, strict=True):
        expected_k[block, :, slot], expected_v[block, :, slot] = k_row, v_row
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_plan_scratch_is_reused_across_layers_without_stale_results() -> None:
    """One plan, several layers (different caches): each result matches its own layer."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, CPU, min_shared_tokens=4)
    gen = torch.Generator().manual_seed(7)
    for layer in range(3):
        k_cache = torch.randn(batch.k_cache.shape, generator=gen)
        v_cache = torch.randn(batch.v_cache.shape, generator=gen)
        q = _queries(len(batch.seq_lens), 4, 16, seed=layer)
        o_ref, _ = ref_paged_decode(q, k_cache, v_cache, batch.block_tables, batch.seq_lens, 0.25)
        for run in (cascade_decode_attention, paged_decode_attention):
            o, _ = run(q, k_cache, v_cache, plan, 0.25)
            torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)


def test_decode_chunks_cover_the_batch_within_the_byte_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs are consecutive, each padded to its widest window, and stay within the budget
    unless a single request alone exceeds it."""
    monkeypatch.setattr(torch_ops, "DECODE_CHUNK_BYTES", 10 * 100)
    widths = [3, 2, 4, 1, 12, 2, 2, 2, 2, 0, 3]
    chunks = torch_ops.decode_chunks(widths, block_bytes=100)
    assert chunks == [(0, 2, 3), (2, 4, 4), (4, 5, 12), (5, 10, 2), (10, 11, 3)]


@pytest.mark.parametrize("chunk_blocks", [1, 5])
def test_decode_in_chunks_matches_reference(
    monkeypatch: pytest.MonkeyPatch, chunk_blocks: int
) -> None:
    """Chunked decode (one request per chunk, and chunks of ragged widths) equals the
    reference for plain and cascade plans, whose suffix windows start mid-table."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    block_bytes = batch.k_cache[0].nbytes
    monkeypatch.setattr(torch_ops, "DECODE_CHUNK_BYTES", chunk_blocks * block_bytes)
    q = _queries(len(batch.seq_lens), 4, 16)
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25
    )
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, CPU, min_shared_tokens=4)
    assert plan.cascade is not None
    for run in (paged_decode_attention, cascade_decode_attention):
        o, lse = run(q, batch.k_cache, batch.v_cache, plan, 0.25)
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(
    num_requests=st.integers(2, 6),
    block_size=st.sampled_from([1, 3, 4, 16]),
    shared=st.integers(1, 40),
    branch=st.integers(0, 12),
    data=st.data(),
)
def test_hypothesis_cascade_equals_paged(
    num_requests: int, block_size: int, shared: int, branch: int, data: st.DataObject
) -> None:
    """A common prefix, an optional shared branch for the first half, random tails."""
    paths = [
        ("s", "b") if i < num_requests // 2 and branch else ("s",) for i in range(num_requests)
    ]
    tails = [data.draw(st.integers(0, 7)) for _ in paths]
    batch = make_batch(
        paths,
        {"s": shared, "b": max(branch, 1)},
        tails,
        block_size=block_size,
        num_kv_heads=2,
        head_dim=8,
        seed=data.draw(st.integers(0, 9)),
    )
    plan = build_decode_plan(
        batch.block_tables,
        batch.seq_lens,
        block_size,
        CPU,
        min_shared_tokens=data.draw(st.sampled_from([1, 4, 16])),
    )
    q = _queries(num_requests, 4, 8)
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.4
    )
    runs = [paged_decode_attention] + ([cascade_decode_attention] if plan.cascade else [])
    for run in runs:
        o, lse = run(q, batch.k_cache, batch.v_cache, plan, 0.4)
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)


def test_package_imports_and_serves_without_triton() -> None:
    """With triton unimportable the package still imports and the torch paths serve."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, eclectus.kernels as k\n"
        "assert not k.HAS_TRITON\n"
        "kc = torch.randn(4, 1, 2, 16); plan = k.plan_decode([[1, 2], [1, 3]], [4, 3], 2,"
        " torch.device('cpu'))\n"
        "o = k.decode_attention(torch.randn(2, 2, 16), kc, kc, plan, 0.25)\n"
        "assert o.shape == (2, 2, 16) and 'triton' not in [m.split('.')[0] for m in"
        " sys.modules if sys.modules[m] is not None]\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ECLECTUS_KERNELS": ""},
    )
    assert result.returncode == 0, result.stderr


def test_importing_the_kernels_chooses_no_backend() -> None:
    """ECLECTUS_KERNELS is read at the first kernel call, not at import: a value set after
    the import is the one used, and a bad one fails that call, naming the variable, not the
    import."""
    code = (
        "import os, torch\n"
        "os.environ['ECLECTUS_KERNELS'] = 'bogus'\n"
        "import eclectus.kernels as k\n"
        "from eclectus.kernels import dispatch\n"
        "assert dispatch._forced is None\n"
        "q = torch.randn(2, 2, 16)\n"
        "try:\n"
        "    k.use_triton(q)\n"
        "except ValueError as exc:\n"
        "    assert 'ECLECTUS_KERNELS' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('a bad ECLECTUS_KERNELS was accepted')\n"
        "os.environ['ECLECTUS_KERNELS'] = 'torch'\n"
        "kc = torch.randn(4, 1, 2, 16)\n"
        "assert not k.dispatch.use_native(q, kc) and dispatch._forced == 'torch'\n"
    )
    env = {**os.environ}
    env.pop("ECLECTUS_KERNELS", None)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
