"""Triton prefill attention over a paged prefix (fits chunked prefill).

Program (tile, request, query head): BLOCK_M of the request's new queries, at positions
seq_len - query_len + j, against the request's cached tokens [0, last position of the tile],
through its block table, with the causal mask. The new tokens' K/V are already in the cache,
so "attend to the cached blocks and, causally, to themselves" is one loop. Online softmax in
fp32 with exp2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from eclectus.kernels.plans import PrefillPlan
from eclectus.kernels.triton_decode import (
    LOG2E,
    attend_kv_tile,
    cache_strides,
    dot_flags,
    kv_tile_len,
)


@triton.jit
def _prefill_kernel(
    Q,
    K,
    V,
    Out,  # Q/O [T, Hq, D] packed request after request; K/V [blocks, Hkv, bs, D]
    Tables,
    CuQueryLens,
    SeqLens,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_tb,
    scale_log2,
    block_size,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    request = tl.program_id(1)
    head = tl.program_id(2)
    q_begin = tl.load(CuQueryLens + request)
    q_len = tl.load(CuQueryLens + request + 1) - q_begin
    if tile * BLOCK_M >= q_len:  # grid covers the longest request
        return
    seq_len = tl.load(SeqLens + request)
    context = seq_len - q_len
    kv_head = head // GROUP
    table = Tables + request.to(tl.int64) * stride_tb

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < q_len
    positions = context + offs_m
    tokens = (q_begin + offs_m).to(tl.int64)
    q = tl.load(
        Q + tokens[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        mask=m_ok[:, None],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    kv_end = tl.minimum(seq_len, context + (tile + 1) * BLOCK_M)  # causal: nothing later
    for n0 in range(0, kv_end, BLOCK_N):  # position 0 is visible to all: m_i turns finite
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < kv_end
        visible = n_ok[None, :] & (offs_n[None, :] <= positions[:, None])
        m_i, l_i, acc = attend_kv_tile(
            q,
            m_i,
            l_i,
            acc,
            K,
            V,
            table,
            offs_n,
            n_ok,
            visible,
            offs_d,
            kv_head,
            block_size,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_vb,
            stride_vs,
            stride_vh,
            scale_log2,
            FP32_DOT,
            PRECISION,
        )

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        Out + tokens[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        o.to(Out.dtype.element_ty),
        mask=m_ok[:, None],
    )


def prefill_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: PrefillPlan,
    scale: float,
    block_m: int = 64,
    block_n: int | None = None,
) -> Tensor:
    """Prefill attention: q [sum(query_lens), Hq, D] -> o, same shape and dtype. Pure."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if num_tokens != plan.num_tokens:
        raise ValueError(f"q has {num_tokens} tokens, plan expects {plan.num_tokens}")
    block_n = block_n or kv_tile_len(k_cache)
    o = torch.empty_like(q)
    if num_tokens == 0:
        return o
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    grid = (-(-plan.max_query_len // block_m), plan.num_requests, num_q_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        o,
        plan.block_tables,
        plan.cu_query_lens,
        plan.seq_lens,
        q.stride(0),
        q.stride(1),
        o.stride(0),
        o.stride(1),
        *cache_strides(k_cache),
        *cache_strides(v_cache),
        plan.block_tables.stride(0),
        scale * LOG2E,
        block_size,
        GROUP=num_q_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HEAD_DIM=head_dim,
        **dot_flags(q.dtype),
        num_warps=4,
        num_stages=2,
    )
    return o
