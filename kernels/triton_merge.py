"""Triton merges of attention states by log-sum-exp (natural log throughout).

* ``merge_attention_states_triton``: two states, elementwise (the public merge);
* ``combine_partials``: one launch that folds, per request, the KV-split partials of its own
  range (plain decode, or a cascade's suffix) and of every cascade group it belongs to, and
  writes the final output in q's dtype. Empty partials carry lse = -inf and weigh nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _merge_states_kernel(
    OA,
    LseA,
    OB,
    LseB,
    Out,
    Lse,  # O* [N * H, head_dim] contiguous; Lse* [N * H] fp32
    head_dim,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    lse_a = tl.load(LseA + row)
    lse_b = tl.load(LseB + row)
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)  # both empty: keep exp() finite, weights 0
    w_a = tl.exp(lse_a - m)
    w_b = tl.exp(lse_b - m)
    total = w_a + w_b
    inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < head_dim
    o_a = tl.load(OA + row * head_dim + offs, mask=mask, other=0.0).to(tl.float32)
    o_b = tl.load(OB + row * head_dim + offs, mask=mask, other=0.0).to(tl.float32)
    o = (o_a * (w_a * inv) + o_b * (w_b * inv)).to(Out.dtype.element_ty)
    tl.store(Out + row * head_dim + offs, o, mask=mask)
    lse = tl.where(total > 0.0, m + tl.log(tl.where(total > 0.0, total, 1.0)), float("-inf"))
    tl.store(Lse + row, lse)


def merge_attention_states_triton(
    o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Exact, stable merge of two partial attentions over disjoint key sets (natural-log LSE).

    o_a, o_b [N, H, D]; lse_a, lse_b [N, H] fp32; lse = -inf marks an empty side. Returns
    (o [N, H, D] in o_a's dtype, lse [N, H] fp32). Pure.
    """
    if o_a.shape != o_b.shape or lse_a.shape != o_a.shape[:2] or lse_b.shape != lse_a.shape:
        raise ValueError(
            f"shape mismatch: o {tuple(o_a.shape)}/{tuple(o_b.shape)}, "
            f"lse {tuple(lse_a.shape)}/{tuple(lse_b.shape)}"
        )
    num_rows, num_heads, head_dim = o_a.shape
    o = torch.empty_like(o_a)
    lse = torch.empty(num_rows, num_heads, device=o_a.device, dtype=torch.float32)
    if num_rows * num_heads:
        _merge_states_kernel[(num_rows * num_heads,)](
            o_a.contiguous(),
            lse_a.float().contiguous(),
            o_b.contiguous(),
            lse_b.float().contiguous(),
            o,
            lse,
            head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
        )
    return o, lse


@triton.jit
def _fold(m, total, acc, lse_part, o_part):
    """Online LSE merge: state (m [H], total [H], acc [H, D]) absorbs one partial."""
    m_new = tl.maximum(m, lse_part)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: weights 0
    alpha = tl.exp(m - m_safe)
    w = tl.exp(lse_part - m_safe)
    return m_new, total * alpha + w, acc * alpha[:, None] + w[:, None] * o_part


@triton.jit
def _combine_kernel(
    OOwn,
    LseOwn,  # [S_own, B, Hq, D], [S_own, B, Hq] fp32: each request's own range
    OMem,
    LseMem,  # [S_mem, M, Hq, D], [S_mem, M, Hq] fp32: cascade membership rows
    MemberOffsets,
    MemberRows,  # CSR: request b's membership rows are MemberRows[o[b]:o[b+1]]
    Out,
    LseOut,  # [B, Hq, D] (q's dtype), [B, Hq] fp32
    num_heads,
    num_own_splits,
    num_mem_splits,
    stride_oos,
    stride_oob,
    stride_ols,
    stride_olb,
    stride_mos,
    stride_mor,
    stride_mls,
    stride_mlr,
    stride_outb,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_MEMBERS: tl.constexpr,
):
    request = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    h_ok = offs_h < num_heads
    tile = offs_h[:, None] * HEAD_DIM + offs_d[None, :]  # heads and dims are contiguous
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    # pointers advance split by split: 64-bit arithmetic, the partials can pass 2**31 elements
    lse_ptr = LseOwn + request * stride_olb + offs_h
    o_ptr = OOwn + request * stride_oob + tile
    for _ in range(num_own_splits):
        lse_part = tl.load(lse_ptr, mask=h_ok, other=float("-inf"))
        o_part = tl.load(o_ptr, mask=h_ok[:, None], other=0.0)
        m, total, acc = _fold(m, total, acc, lse_part, o_part)
        lse_ptr += stride_ols
        o_ptr += stride_oos
    if HAS_MEMBERS:
        for j in range(tl.load(MemberOffsets + request), tl.load(MemberOffsets + request + 1)):
            row = tl.load(MemberRows + j).to(tl.int64)
            lse_ptr = LseMem + row * stride_mlr + offs_h
            o_ptr = OMem + row * stride_mor + tile
            for _ in range(num_mem_splits):
                lse_part = tl.load(lse_ptr, mask=h_ok, other=float("-inf"))
                o_part = tl.load(o_ptr, mask=h_ok[:, None], other=0.0)
                m, total, acc = _fold(m, total, acc, lse_part, o_part)
                lse_ptr += stride_mls
                o_ptr += stride_mos
    nonempty = total > 0.0
    total_safe = tl.where(nonempty, total, 1.0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    lse = tl.where(nonempty, m_safe + tl.log(total_safe), float("-inf"))
    o = acc / total_safe[:, None]
    tl.store(Out + request * stride_outb + tile, o.to(Out.dtype.element_ty), mask=h_ok[:, None])
    tl.store(LseOut + request * num_heads + offs_h, lse, mask=h_ok)


def combine_partials(
    o_own: Tensor,
    lse_own: Tensor,
    out_dtype: torch.dtype,
    members: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Final states per request from split partials, in one launch.

    o_own [S_own, B, Hq, D] fp32 and lse_own [S_own, B, Hq]: each request's own KV range.
    members: (o_mem [S_mem, M, Hq, D], lse_mem [S_mem, M, Hq], member_offsets int32 [B + 1],
    member_rows int32 [M]) for a cascade, else None. Partials must be contiguous in (Hq, D).
    Returns (o [B, Hq, D] in out_dtype, lse [B, Hq] fp32). Pure.
    """
    _, batch, num_heads, head_dim = o_own.shape
    o = torch.empty(batch, num_heads, head_dim, device=o_own.device, dtype=out_dtype)
    lse = torch.empty(batch, num_heads, device=o_own.device, dtype=torch.float32)
    if members is None:  # the kernel never reads these when HAS_MEMBERS is False
        o_mem, lse_mem, offsets, rows = o_own, lse_own, lse_own, lse_own
    else:
        o_mem, lse_mem, offsets, rows = members
    if batch:
        _combine_kernel[(batch,)](
            o_own,
            lse_own,
            o_mem,
            lse_mem,
            offsets,
            rows,
            o,
            lse,
            num_heads,
            o_own.shape[0],
            o_mem.shape[0],
            o_own.stride(0),
            o_own.stride(1),
            lse_own.stride(0),
            lse_own.stride(1),
            o_mem.stride(0),
            o_mem.stride(1),
            lse_mem.stride(0),
            lse_mem.stride(1),
            o.stride(0),
            HEAD_DIM=head_dim,
            BLOCK_H=triton.next_power_of_2(num_heads),
            HAS_MEMBERS=members is not None,
        )
    return o, lse
