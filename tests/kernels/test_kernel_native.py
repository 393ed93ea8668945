"""The compiled CPU decode kernel (kernels/native.py) against the looped references."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import make_batch, nested_batch

from eclectus.kernels import (
    CASCADE_MIN_GROUP_SIZE,
    CASCADE_MIN_SHARED_TOKENS,
    build_decode_plan,
    cascade_thresholds,
    decode_attention,
    native,
    paged_decode_attention,
    ref_paged_decode,
    store_kv,
)
from eclectus.kernels.dispatch import NATIVE_CASCADE_THRESHOLDS, force_backend, use_native

pytestmark = pytest.mark.skipif(not native.available(), reason="no working C compiler")


def _queries(batch: int, num_q_heads: int, head_dim: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, num_q_heads, head_dim, generator=torch.Generator().manual_seed(seed))


def _tables(block_tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in block_tables)
    rows = [t + [0] * (width - len(t)) for t in block_tables]
    return torch.tensor(rows, dtype=torch.int32)


def _run(batch: object, q: torch.Tensor, scale: float, kv_starts: list[int] | None = None):
    starts = torch.tensor(kv_starts, dtype=torch.int32) if kv_starts is not None else None
    return native.paged_decode_native(
        q,
        batch.k_cache,  # type: ignore[attr-defined]
        batch.v_cache,  # type: ignore[attr-defined]
        _tables(batch.block_tables),  # type: ignore[attr-defined]
        torch.tensor(batch.seq_lens, dtype=torch.int32),  # type: ignore[attr-defined]
        scale,
        starts,
    )


def _assert_reference(
    batch: object,
    q: torch.Tensor,
    scale: float,
    got: tuple[torch.Tensor, torch.Tensor],
    kv_starts: list[int] | None = None,
    tol: tuple[float, float] = (1e-5, 1e-5),  # (o, lse) absolute tolerances
) -> None:
    """``got`` (o, lse) equals the looped reference over the same windows."""
    o_ref, lse_ref = ref_paged_decode(
        q,
        batch.k_cache,  # type: ignore[attr-defined]
        batch.v_cache,  # type: ignore[attr-defined]
        batch.block_tables,  # type: ignore[attr-defined]
        batch.seq_lens,  # type: ignore[attr-defined]
        scale,
        kv_starts,
    )
    torch.testing.assert_close(got[0], o_ref, atol=tol[0], rtol=tol[0])
    torch.testing.assert_close(got[1], lse_ref, atol=tol[1], rtol=1e-5)


@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim", "block_size"),
    [(4, 2, 64, 4), (8, 8, 16, 16), (12, 4, 128, 3), (2, 1, 8, 1)],
)
def test_matches_reference(num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
    """Ragged lengths, prefixes off block boundaries, GQA, an empty suffix, shuffled blocks."""
    batch = nested_batch(block_size=block_size, num_kv_heads=num_kv_heads, head_dim=head_dim)
    q = _queries(len(batch.seq_lens), num_q_heads, head_dim)
    _assert_reference(batch, q, 0.3, _run(batch, q, 0.3))


def test_windows_and_empty_windows() -> None:
    """kv_starts cut a window (the cascade's suffix pass); an empty one is (0, -inf)."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=32)
    q = _queries(len(batch.seq_lens), 4, 32)
    starts = [min(n, s) for n, s in zip(batch.seq_lens, [5, 0, 34, 29, 3, 21, 7], strict=True)]
    o, lse = _run(batch, q, 0.25, starts)
    _assert_reference(batch, q, 0.25, (o, lse), starts)
    empty = [i for i, (s, n) in enumerate(zip(starts, batch.seq_lens, strict=True)) if s >= n]
    assert empty, "the case must hold an empty window"
    assert torch.all(lse[empty] == -torch.inf) and torch.all(o[empty] == 0)


def test_large_scores_stay_finite() -> None:
    """Scores far from zero: the max is subtracted before exp, LSE carries it back."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    q = _queries(len(batch.seq_lens), 4, 16) * 300
    o, lse = _run(batch, q, 1.0)
    assert torch.isfinite(o).all()
    _assert_reference(batch, q, 1.0, (o, lse), tol=(1e-4, 1e-3))


def test_strided_cache_views() -> None:
    """Any (block, head, slot) strides: a cache that is a slice of a bigger pool."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    pool_k = torch.stack([torch.zeros_like(batch.k_cache), batch.k_cache])  # layer 1 of 2
    pool_v = torch.stack([torch.zeros_like(batch.v_cache), batch.v_cache])
    q = _queries(len(batch.seq_lens), 4, 16)
    tables = _tables(batch.block_tables)
    lens = torch.tensor(batch.seq_lens, dtype=torch.int32)
    got = native.paged_decode_native(q, pool_k[1], pool_v[1], tables, lens, 0.5)
    _assert_reference(batch, q, 0.5, got)


def test_bad_arguments_are_named() -> None:
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    q = _queries(len(batch.seq_lens), 4, 16)
    tables = _tables(batch.block_tables)
    lens = torch.tensor(batch.seq_lens, dtype=torch.int32)
    with pytest.raises(ValueError, match="fp32"):
        native.paged_decode_native(
            q.bfloat16(), batch.k_cache.bfloat16(), batch.v_cache.bfloat16(), tables, lens, 1.0
        )
    with pytest.raises(ValueError, match="int32"):
        native.paged_decode_native(q, batch.k_cache, batch.v_cache, tables.long(), lens, 1.0)
    # what would make the kernel read outside the cache is refused before it runs
    with pytest.raises(ValueError, match="outside"):
        native.paged_decode_native(q, batch.k_cache, batch.v_cache, tables - 1, lens, 1.0)
    with pytest.raises(ValueError, match="longer than its block table"):
        native.paged_decode_native(q, batch.k_cache, batch.v_cache, tables[:, :1], lens, 1.0)
    with pytest.raises(ValueError, match="negative kv_starts"):
        native.paged_decode_native(q, batch.k_cache, batch.v_cache, tables, lens, 1.0, -lens)
    with pytest.raises(ValueError, match="head mismatch"):
        native.paged_decode_native(q[:, :3], batch.k_cache, batch.v_cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="head_dim stride"):
        k_t = batch.k_cache.transpose(2, 3)
        native.paged_decode_native(q, k_t, k_t, tables, lens, 1.0)


@settings(max_examples=25, deadline=None)
@given(
    tails=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    prefix=st.integers(1, 50),
    block_size=st.sampled_from([1, 2, 5, 16]),
    heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (8, 1)]),
    head_dim=st.sampled_from([4, 16, 64, 80]),
)
def test_hypothesis_shapes(
    tails: list[int], prefix: int, block_size: int, heads: tuple[int, int], head_dim: int
) -> None:
    num_q_heads, num_kv_heads = heads
    batch = make_batch(
        [("p",)] * len(tails),
        {"p": prefix},
        tails,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    q = _queries(len(tails), num_q_heads, head_dim, seed=len(tails))
    scale = head_dim**-0.5
    _assert_reference(batch, q, scale, _run(batch, q, scale), tol=(2e-5, 2e-5))


def test_builds_into_a_fresh_cache_and_reports_a_missing_compiler(tmp_path: Path) -> None:
    """A new cache directory gets the library; with no compiler, it is unavailable and the
    caller is told why, not crashed."""
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from eclectus.kernels import native\n"
        "print('available', native.available())\n"
    )
    env = os.environ | {"ECLECTUS_CACHE": str(tmp_path)}
    env.pop("ECLECTUS_KERNELS", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "available True" in done.stdout, done.stderr
    assert list((tmp_path / "kernels").glob("paged_decode-*.so"))
    env |= {"CC": str(tmp_path / "no-such-cc"), "ECLECTUS_CACHE": str(tmp_path / "other")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "available False" in done.stdout
    assert "decode attention stays on the torch path" in done.stderr


def test_dispatch_serves_plain_and_cascade_decode_natively(backend_choice: contextlib.ExitStack):
    """Through the engine's entry points, forced to the native kernel: plain paged decode, and
    the cascade whose suffix pass it serves, both equal attention over the whole sequences."""
    backend_choice.enter_context(force_backend("native"))
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=32)
    q = _queries(len(batch.seq_lens), 4, 32)
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.3
    )
    for cascade in (False, True):
        plan = build_decode_plan(
            batch.block_tables,
            batch.seq_lens,
            4,
            torch.device("cpu"),
            cascade=cascade,
            min_shared_tokens=4,
        )
        assert (plan.cascade is not None) == cascade
        o = decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.3)
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    o, lse = paged_decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.3)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)


def test_dispatch_choice(backend_choice: contextlib.ExitStack) -> None:
    """Auto: fp32 CPU decode is native, bf16 is not; torch switches it off; native insists."""
    k32 = torch.zeros(2, 1, 4, 8)
    q32 = torch.zeros(1, 1, 8)
    backend_choice.enter_context(force_backend(""))
    assert use_native(q32, k32) and not use_native(q32.bfloat16(), k32.bfloat16())
    backend_choice.enter_context(force_backend("torch"))
    assert not use_native(q32, k32)
    backend_choice.enter_context(force_backend("native"))
    with pytest.raises(RuntimeError, match="native kernel cannot serve"):
        use_native(q32.bfloat16(), k32.bfloat16())


def test_a_plan_pointing_outside_the_cache_is_refused() -> None:
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    q = _queries(len(batch.seq_lens), 4, 16)
    tables = [[*t, len(batch.k_cache)] for t in batch.block_tables]  # one block too far
    plan = build_decode_plan(
        tables, [n + 4 for n in batch.seq_lens], 4, torch.device("cpu"), cascade=False
    )
    with pytest.raises(ValueError, match="outside"):
        native.decode_window(q, batch.k_cache, batch.v_cache, plan, 1.0)
    wrong_size = build_decode_plan(
        batch.block_tables, batch.seq_lens, 8, torch.device("cpu"), cascade=False
    )
    with pytest.raises(ValueError, match="block_size"):
        native.decode_window(q, batch.k_cache, batch.v_cache, wrong_size, 1.0)


def test_cascade_thresholds_follow_the_decode_backend(backend_choice: contextlib.ExitStack) -> None:
    """Native decode reads a shared prefix from cache cheaply: only big groups pay."""
    cache = torch.zeros(2, 1, 4, 8)
    backend_choice.enter_context(force_backend(""))
    assert cascade_thresholds(cache) == NATIVE_CASCADE_THRESHOLDS
    assert cascade_thresholds(cache.bfloat16()) == (
        CASCADE_MIN_SHARED_TOKENS,
        CASCADE_MIN_GROUP_SIZE,
    )
    backend_choice.enter_context(force_backend("torch"))
    assert cascade_thresholds(cache) == (CASCADE_MIN_SHARED_TOKENS, CASCADE_MIN_GROUP_SIZE)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 12),
    st.sampled_from([(1, 4), (2, 8), (4, 16)]),
    st.sampled_from([1, 4, 16]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_native_store_kv_writes_what_the_torch_store_writes(
    tokens: int, heads: tuple[int, int], block_size: int, fused: bool, seed: int
) -> None:
    """Any slots, kv heads and block size, rows given as views of a fused projection or
    contiguous: the C store leaves both caches exactly as torch's indexed assignment does."""
    num_kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 1 + (tokens + block_size - 1) // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    if fused:  # k and v as the model hands them: strided views into [T, (Hq + 2 Hkv) * D]
        qkv = torch.randn(tokens, 4 * num_kv_heads * head_dim, generator=gen)
        k = qkv[:, 2 * num_kv_heads * head_dim : 3 * num_kv_heads * head_dim]
        v = qkv[:, 3 * num_kv_heads * head_dim :]
        k, v = k.view(tokens, num_kv_heads, head_dim), v.view(tokens, num_kv_heads, head_dim)
    else:
        k = torch.randn(tokens, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(tokens, num_kv_heads, head_dim, generator=gen)
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    k_native, v_native = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    k_torch, v_torch = k_native.clone(), v_native.clone()
    with force_backend("native"):
        store_kv(k, v, k_native, v_native, slots)
    with force_backend("torch"):
        store_kv(k, v, k_torch, v_torch, slots)
    assert torch.equal(k_native, k_torch) and torch.equal(v_native, v_torch)


def test_native_store_kv_refuses_a_slot_outside_the_cache() -> None:
    """A slot past the last block is a ValueError naming the cache, and nothing is written."""
    k_cache, v_cache = torch.zeros(2, 1, 4, 8), torch.zeros(2, 1, 4, 8)
    k, v = torch.ones(2, 1, 8), torch.ones(2, 1, 8)
    with pytest.raises(ValueError, match="outside the cache's 2 blocks"):
        native.store_kv_native(k, v, k_cache, v_cache, torch.tensor([1, 8]))
    assert not k_cache.any() and not v_cache.any()
