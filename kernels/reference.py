"""Torch references: the definitions the fast paths and Triton kernels are tested against.

Written for clarity, not speed: one request at a time, fp32 math, explicit softmax. LSE is the
natural-log log-sum-exp of the scaled scores; an empty key range gives o = 0, lse = -inf.
Nothing here mutates its inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def gather_kv(
    cache: Tensor, table: list[int] | Tensor, start: int, end: int, block_size: int
) -> Tensor:
    """Tokens [start, end) of one sequence.

    cache [num_blocks, Hkv, block_size, D] -> [end - start, Hkv, D]."""
    positions = torch.arange(start, end, device=cache.device)
    table_t = torch.as_tensor(table, device=cache.device).long()
    blocks = table_t[positions // block_size]
    return cache[blocks, :, positions % block_size]  # advanced indices first: [n, Hkv, D]


def ref_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Dense attention with GQA: q [M, Hq, D], k/v [N, Hkv, D], mask bool [M, N] (True = keep).

    Returns (o [M, Hq, D] in q's dtype, lse [M, Hq] fp32, natural log).
    """
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)  # [N, Hq, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), kf) * scale  # [Hq, M, N]
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # [Hq, M]
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # rows with no key: lse=-inf
    o = torch.einsum("hmn,nhd->mhd", probs, vf)
    return o.to(q.dtype), lse.transpose(0, 1).contiguous()


def ref_paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: list[list[int]],
    seq_lens: list[int],
    scale: float,
    kv_starts: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Request i's single query q[i] ([B, Hq, D]) attends to its tokens [kv_starts[i], seq_lens[i]).

    Returns (o [B, Hq, D], lse [B, Hq] fp32).
    """
    block_size = k_cache.shape[2]
    starts = kv_starts or [0] * len(seq_lens)
    outs, lses = [], []
    for i, (table, n, s) in enumerate(zip(block_tables, seq_lens, starts, strict=True)):
        k = gather_kv(k_cache, table, s, n, block_size)
        v = gather_kv(v_cache, table, s, n, block_size)
        o, lse = ref_attention(q[i : i + 1], k, v, scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def ref_prefill(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: list[list[int]],
    query_lens: list[int],
    seq_lens: list[int],
    scale: float,
) -> tuple[Tensor, Tensor]:
    """Packed queries q [sum(query_lens), Hq, D]; query j of request i sits at position
    seq_lens[i] - query_lens[i] + j and attends causally. Returns (o like q, lse [T, Hq])."""
    block_size = k_cache.shape[2]
    outs, lses, row = [], [], 0
    for table, nq, n in zip(block_tables, query_lens, seq_lens, strict=True):
        k = gather_kv(k_cache, table, 0, n, block_size)
        v = gather_kv(v_cache, table, 0, n, block_size)
        positions = torch.arange(n - nq, n, device=q.device)
        mask = torch.arange(n, device=q.device)[None, :] <= positions[:, None]
        o, lse = ref_attention(q[row : row + nq], k, v, scale, mask)
        outs.append(o)
        lses.append(lse)
        row += nq
    return torch.cat(outs), torch.cat(lses)


def ref_merge_attention_states(
    o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Attention over the union of two disjoint key sets, from each side's (o, lse).

    o [N, H, D], lse [N, H] fp32, natural log; an empty side has lse = -inf.
    """
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse).nan_to_num(0.0)[..., None]  # both -inf -> nan -> 0
    w_b = torch.exp(lse_b - lse).nan_to_num(0.0)[..., None]
    o = o_a.float() * w_a + o_b.float() * w_b
    return o.to(o_a.dtype), lse
