"""Triton shared-prefix (cascade) decode and the LSE merge of attention states.

Cascade decode = (1) every group's shared blocks against all its members' queries, stacked
into tiles (the item kernel of ``triton_decode``, one item per group, all levels in ONE
launch), (2) each request's own suffix (the same kernel, one item per request, starting at the
plan's suffix_starts), (3) one merge of all membership rows and suffixes per request by LSE.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from eclectus.kernels.plans import DecodePlan
from eclectus.kernels.torch_ops import combine_states_by_index
from eclectus.kernels.triton_decode import paged_decode_triton, paged_items_attention
from torch import Tensor


@triton.jit
def _merge_states_kernel(
    OA, LseA, OB, LseB, Out, Lse,  # O* [N * H, HEAD_DIM] contiguous; Lse* [N * H] fp32
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


def merge_attention_states_triton(o_a: Tensor, lse_a: Tensor, o_b: Tensor,
                                  lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Exact, stable merge of two partial attentions over disjoint key sets (natural-log LSE).

    o_a, o_b [N, H, D]; lse_a, lse_b [N, H] fp32; lse = -inf marks an empty side. Returns
    (o [N, H, D] in o_a's dtype, lse [N, H] fp32). Pure.
    """
    if o_a.shape != o_b.shape or lse_a.shape != o_a.shape[:2] or lse_b.shape != lse_a.shape:
        raise ValueError(f"shape mismatch: o {tuple(o_a.shape)}/{tuple(o_b.shape)}, "
                         f"lse {tuple(lse_a.shape)}/{tuple(lse_b.shape)}")
    num_rows, num_heads, head_dim = o_a.shape
    o = torch.empty_like(o_a)
    lse = torch.empty(num_rows, num_heads, device=o_a.device, dtype=torch.float32)
    if num_rows * num_heads:
        _merge_states_kernel[(num_rows * num_heads,)](
            o_a.contiguous(), lse_a.float().contiguous(), o_b.contiguous(),
            lse_b.float().contiguous(), o, lse, head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim))
    return o, lse


def cascade_prefix_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan,
                          scale: float, num_splits: int | None = None) -> tuple[Tensor, Tensor]:
    """Every group's shared blocks for its stacked queries, all levels in one launch.

    Returns membership-row states (o [num_members, Hq, D] fp32, lse [num_members, Hq] fp32).
    """
    cascade = plan.cascade
    if cascade is None:
        raise ValueError("plan has no cascade groups")
    return paged_items_attention(
        q, k_cache, v_cache, plan.block_tables, cascade.member_request_ids,
        cascade.group_table_rows, cascade.group_starts, cascade.group_ends,
        cascade.group_member_offsets, num_rows=cascade.member_request_ids.numel(),
        max_rows_per_item=cascade.max_group_size, max_len=cascade.max_group_tokens,
        scale=scale, num_splits=num_splits)


def cascade_decode_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan,
                          scale: float, num_splits: int | None = None) -> tuple[Tensor, Tensor]:
    """Shared-prefix decode. q [B, Hq, D] -> (o [B, Hq, D] in q's dtype, lse [B, Hq] fp32)."""
    cascade = plan.cascade
    if cascade is None:
        raise ValueError("plan has no cascade groups")
    o_mem, lse_mem = cascade_prefix_triton(q, k_cache, v_cache, plan, scale, num_splits)
    o_suf, lse_suf = paged_decode_triton(
        q, k_cache, v_cache, plan.block_tables, plan.seq_lens, scale,
        max_len=cascade.max_suffix_blocks * plan.block_size, kv_starts=cascade.suffix_starts,
        num_splits=num_splits)
    batch = q.shape[0]
    index = torch.cat([cascade.member_request_ids, torch.arange(batch, device=q.device)])
    o, lse = combine_states_by_index(torch.cat([o_mem, o_suf]),
                                     torch.cat([lse_mem, lse_suf]), index, batch)
    return o.to(q.dtype), lse
