"""The native cascade prefix pass (kernels/native.py ``cascade_prefix``) against the torch
group pass, and the native cascade as a whole against attention over the whole sequences."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import PagedBatch, make_batch, nested_batch

from eclectus.kernels import (
    build_decode_plan,
    decode_attention,
    native,
    native_cascade,
    ref_paged_decode,
)
from eclectus.kernels.dispatch import force_backend
from eclectus.kernels.plans import DecodePlan
from eclectus.kernels.torch_ops import cascade_prefix_torch

pytestmark = pytest.mark.skipif(not native.available(), reason="no working C compiler")


def _queries(batch: int, num_q_heads: int, head_dim: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, num_q_heads, head_dim, generator=torch.Generator().manual_seed(seed))


def _plan(batch: PagedBatch, min_shared_tokens: int = 1) -> DecodePlan:
    plan = build_decode_plan(
        batch.block_tables,
        batch.seq_lens,
        batch.block_size,
        torch.device("cpu"),
        min_shared_tokens=min_shared_tokens,
    )
    assert plan.cascade is not None, "the case must form cascade groups"
    return plan


def _assert_prefix_matches_torch(batch: PagedBatch, q: torch.Tensor, scale: float) -> None:
    """Native and torch prefix passes agree row by row (membership order), o and LSE."""
    plan = _plan(batch)
    o, lse = native_cascade.cascade_prefix(q, batch.k_cache, batch.v_cache, plan, scale)
    o_ref, lse_ref = cascade_prefix_torch(q, batch.k_cache, batch.v_cache, plan, scale)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim", "block_size"),
    [(4, 2, 64, 4), (8, 8, 16, 16), (12, 4, 128, 3), (2, 1, 8, 1), (6, 2, 70, 5)],
)
def test_prefix_pass_matches_torch(
    num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    """Nested groups (levels), GQA, head_dim not a multiple of 4 (70), shuffled blocks."""
    batch = nested_batch(block_size=block_size, num_kv_heads=num_kv_heads, head_dim=head_dim)
    q = _queries(len(batch.seq_lens), num_q_heads, head_dim)
    _assert_prefix_matches_torch(batch, q, head_dim**-0.5)


def test_many_rows_and_long_blocks() -> None:
    """A group of 37 requests x 3 query heads (rows span several vector chunks, padded) over
    blocks of 80 tokens (tiles cut inside a block) with scores far from zero."""
    batch = make_batch(
        [("p",)] * 37, {"p": 400}, list(range(37)), block_size=80, num_kv_heads=1, head_dim=16
    )
    q = _queries(37, 3, 16) * 40
    _assert_prefix_matches_torch(batch, q, 0.25)


def test_groups_larger_than_a_member_tile(backend_choice: contextlib.ExitStack) -> None:
    """A group of 150 requests (cut into tiles of 64 members: 64, 64, 22, each sweeping the
    keys on its own) beside a group of 9 and a loner: every membership row lands where the
    one-sweep torch pass puts it."""
    paths = [("p", "x")] * 150 + [("q",)] * 9 + [("r",)]
    batch = make_batch(
        paths,
        {"p": 40, "x": 12, "q": 24, "r": 8},
        [i % 5 + 1 for i in range(len(paths))],
        block_size=4,
        num_kv_heads=2,
        head_dim=16,
    )
    q = _queries(len(paths), 4, 16)
    plan = _plan(batch)
    assert max(len(g.request_ids) for g in plan.require_cascade().groups) == 150
    _assert_prefix_matches_torch(batch, q, 0.25)
    backend_choice.enter_context(force_backend("native"))
    o = decode_attention(q, batch.k_cache, batch.v_cache, plan, 0.25)
    o_ref, _ = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25
    )
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)


def test_strided_cache_views() -> None:
    """The caches may be slices of a bigger pool (layer 1 of 2)."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    q = _queries(len(batch.seq_lens), 4, 16)
    plan = _plan(batch)
    pool_k = torch.stack([torch.zeros_like(batch.k_cache), batch.k_cache])
    pool_v = torch.stack([torch.zeros_like(batch.v_cache), batch.v_cache])
    got = native_cascade.cascade_prefix(q, pool_k[1], pool_v[1], plan, 0.5)
    want = cascade_prefix_torch(q, batch.k_cache, batch.v_cache, plan, 0.5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_a_plan_without_groups_or_outside_the_cache_is_refused() -> None:
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=16)
    q = _queries(len(batch.seq_lens), 4, 16)
    plain = build_decode_plan(
        batch.block_tables, batch.seq_lens, 4, torch.device("cpu"), cascade=False
    )
    with pytest.raises(ValueError, match="no cascade groups"):
        native_cascade.cascade_prefix(q, batch.k_cache, batch.v_cache, plain, 1.0)
    small_k, small_v = batch.k_cache[:2], batch.v_cache[:2]  # tables point past block 1
    with pytest.raises(ValueError, match="outside"):
        native_cascade.cascade_prefix(q, small_k, small_v, _plan(batch), 1.0)
    with pytest.raises(ValueError, match="fp32"):
        native_cascade.cascade_prefix(
            q.bfloat16(), batch.k_cache.bfloat16(), batch.v_cache.bfloat16(), _plan(batch), 1.0
        )


def test_native_cascade_equals_whole_sequence_attention(
    backend_choice: contextlib.ExitStack,
) -> None:
    """Forced native: prefix pass, suffix pass and merge give paged attention over the whole
    sequences, the same as the torch cascade."""
    batch = nested_batch(block_size=4, num_kv_heads=2, head_dim=32)
    q = _queries(len(batch.seq_lens), 4, 32)
    o_ref, _ = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.3
    )
    for backend in ("native", "torch"):
        backend_choice.enter_context(force_backend(backend))
        o = decode_attention(q, batch.k_cache, batch.v_cache, _plan(batch, 4), 0.3)
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    forest=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 30)), min_size=2, max_size=24
    ),
    block_size=st.sampled_from([1, 2, 5, 16, 70]),
    heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (8, 1)]),
    head_dim=st.sampled_from([4, 16, 64, 80, 7]),
)
def test_hypothesis_prefix_forests(
    forest: list[tuple[int, int, int]],
    block_size: int,
    heads: tuple[int, int],
    head_dim: int,
) -> None:
    """Random prefix forests (root -> branch -> private tail), shapes and block sizes: the
    native prefix pass equals the torch one, the native cascade equals plain attention."""
    roots = {"r0": 37, "r1": 90, "r2": 3}
    branches = {"b0": 11, "b1": 150}
    paths = [(f"r{r}", f"r{r}b{b}") for r, b, _ in forest]
    lens = roots | {f"r{r}b{b}": branches[f"b{b}"] for r, b, _ in forest}
    num_q_heads, num_kv_heads = heads
    batch = make_batch(
        paths,
        lens,
        [t for _, _, t in forest],
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    q = _queries(len(forest), num_q_heads, head_dim, seed=len(forest))
    scale = head_dim**-0.5
    plan = build_decode_plan(
        batch.block_tables, batch.seq_lens, block_size, torch.device("cpu"), min_shared_tokens=1
    )
    if plan.cascade is None:
        return  # blocks too long for any full shared block: nothing to group
    _assert_prefix_matches_torch(batch, q, scale)
    o_ref, _ = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, scale
    )
    with force_backend("native"):
        o = decode_attention(q, batch.k_cache, batch.v_cache, plan, scale)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)


@settings(max_examples=25, deadline=None)
@given(
    num_members=st.integers(1, 140),
    prefix_len=st.integers(1, 110),
    block_size=st.sampled_from([1, 3, 16, 33, 80]),
    heads=st.sampled_from([(2, 1), (4, 2), (3, 1), (1, 1)]),
    head_dim=st.sampled_from([7, 16, 70]),
    spread=st.floats(0.5, 40.0),
)
def test_hypothesis_register_blocks_and_key_tiles(
    num_members: int,
    prefix_len: int,
    block_size: int,
    heads: tuple[int, int],
    head_dim: int,
    spread: float,
) -> None:
    """One group, sized across the kernel's blockings: rows not a multiple of the 64-row
    register block (1-3 vector tails) or of a 64-member task, keys not a multiple of the
    4- or 8-key step or of the 32-key tile (tiles cross block boundaries, blocks longer than
    a tile), head dims not a multiple of the 4- or 8-dim step, scores near and far from 0."""
    num_q_heads, num_kv_heads = heads
    batch = make_batch(
        [("p",)] * num_members,
        {"p": prefix_len},
        [i % 3 + 1 for i in range(num_members)],
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    plan = build_decode_plan(
        batch.block_tables, batch.seq_lens, block_size, torch.device("cpu"), min_shared_tokens=1
    )
    if plan.cascade is None:
        return  # a prefix shorter than one block, or a single request: nothing is shared
    q = _queries(num_members, num_q_heads, head_dim, seed=num_members) * spread
    _assert_prefix_matches_torch(batch, q, head_dim**-0.5)
