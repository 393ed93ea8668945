"""Triton paged attention for decode-shaped work: few queries, long paged KV ranges.

One kernel serves both plain paged decode and the shared-prefix (cascade) pass. Its unit of
work is an ITEM: a list of query rows (each row = one request's query, all GROUP query heads
of one kv head) that attend to the same token range [start, end) of one block table row.

* plain decode: one item per request, one row each;
* cascade prefix: one item per group, one row per member request, so a tile stacks
  BLOCK_R requests x GROUP heads into a [BLOCK_M, D] query tile and each K/V tile read from
  memory feeds one matrix-matrix product for all of them.

Long ranges are split over NUM_SPLITS programs (flash-decoding) so that few items still fill
the GPU; the partial states are merged by LSE afterwards. Math in fp32 with exp2; the LSE
written out is natural log.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from eclectus.kernels.plans import DecodePlan
from eclectus.kernels.triton_merge import combine_partials

LN2 = tl.constexpr(0.6931471805599453)  # ln 2: the kernel's log2-domain LSE -> natural log
LOG2E = 1.4426950408889634  # 1 / ln 2: folds into the scale so the kernel can use exp2


def dot_flags(dtype: torch.dtype) -> dict[str, object]:
    """Compile-time dot settings: fp32 inputs use exact ("ieee") products, not TF32; the CPU
    interpreter multiplies bf16 tiles wrongly (it sees raw bits), so it gets fp32 tiles."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    exact = interpreted or dtype == torch.float32
    return {"FP32_DOT": interpreted, "PRECISION": "ieee" if exact else "tf32"}


@triton.jit
def attn_dot(a, b, FP32_DOT: tl.constexpr, PRECISION: tl.constexpr):
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def attend_kv_tile(
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
    FP32_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One online-softmax step (log2 domain) of q over the paged K/V tokens ``offs_n``
    (``n_ok``: inside the range; ``visible`` [M, N]: the scores kept). Returns the new
    (m_i, l_i, acc). Shared by the decode-item and the prefill kernels."""
    blocks = tl.load(table + offs_n // block_size, mask=n_ok, other=0).to(tl.int64)
    slots = offs_n % block_size
    k = tl.load(
        K
        + (blocks * stride_kb + slots * stride_ks + kv_head * stride_kh)[:, None]
        + offs_d[None, :],
        mask=n_ok[:, None],
        other=0.0,
    )
    s = attn_dot(q, tl.trans(k), FP32_DOT, PRECISION) * scale_log2
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        V
        + (blocks * stride_vb + slots * stride_vs + kv_head * stride_vh)[:, None]
        + offs_d[None, :],
        mask=n_ok[:, None],
        other=0.0,
    )
    acc = acc * alpha[:, None] + attn_dot(p.to(v.dtype), v, FP32_DOT, PRECISION)
    return m_new, l_i, acc


@triton.jit
def _paged_items_kernel(
    Q,
    K,
    V,
    Out,
    Lse,  # Q [B, Hq, D]; K/V [blocks, Hkv, block_size, D]; fp32 partials
    Tables,
    RowRequests,
    ItemTableRows,
    ItemStarts,
    ItemEnds,
    ItemRowOffsets,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_os,
    stride_or,
    stride_oh,  # Out [num_splits, rows, Hq, D]
    stride_ls,
    stride_lr,  # Lse [num_splits, rows, Hq]
    stride_tb,
    scale_log2,
    split_len,
    block_size,
    num_splits,
    GROUP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    item = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2) // num_splits
    split = (tl.program_id(2) % num_splits).to(tl.int64)  # int64: offsets into the partials
    row_begin = tl.load(ItemRowOffsets + item) + tile * BLOCK_R
    row_end = tl.load(ItemRowOffsets + item + 1)
    if row_begin >= row_end:  # the grid covers the largest item; smaller ones stop here
        return
    start = tl.load(ItemStarts + item) + (split * split_len).to(tl.int32)
    end = tl.minimum(tl.load(ItemEnds + item), start + split_len)
    table = Tables + tl.load(ItemTableRows + item).to(tl.int64) * stride_tb

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = row_begin + offs_m // GROUP  # row m holds head (m % GROUP) of one request
    heads = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_R * GROUP) & (rows < row_end)
    requests = tl.load(RowRequests + rows, mask=row_ok, other=0).to(tl.int64)
    q = tl.load(
        Q + requests[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(start, end, BLOCK_N):  # every tile holds >= 1 valid key: m_i turns finite
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
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
            n_ok[None, :],
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

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    o_rows = split * stride_os + rows.to(tl.int64) * stride_or + heads * stride_oh
    tl.store(Out + o_rows[:, None] + offs_d[None, :], acc / l_safe[:, None], mask=row_ok[:, None])
    tl.store(Lse + split * stride_ls + rows.to(tl.int64) * stride_lr + heads, lse, mask=row_ok)


def cache_strides(cache: Tensor) -> tuple[int, int, int]:
    """(stride_block, stride_slot, stride_head) of a [num_blocks, Hkv, block_size, D] cache,
    in the order the kernels take them (block, slot in block, kv head)."""
    return cache.stride(0), cache.stride(2), cache.stride(1)


def kv_tile_len(k_cache: Tensor) -> int:
    """Tokens per K/V tile: 64 for 16-bit caches; 32 for fp32 so two pipelined K and V tiles
    of D = 128 stay within the shared memory of smaller GPUs."""
    return 64 if k_cache.element_size() <= 2 else 32


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: a few splits, so tests exercise the split merge


def choose_splits(num_programs: int, max_len: int, block_n: int, device: torch.device) -> int:
    """KV splits so that about one program per SM runs, each split >= 4 KV tiles.

    One wave is enough to keep HBM busy (each program keeps two K/V tile pairs in flight),
    and every extra split writes, and the combine reads, one more fp32 partial per row:
    for a 64-request group that is 1 MiB per split against a 32 MiB 8k-token prefix.
    """
    wanted = -(-_num_sms(device) // max(num_programs, 1))
    return max(1, min(wanted, max_len // (4 * block_n)))


def paged_items_partials(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    tables: Tensor,
    row_requests: Tensor,
    item_table_rows: Tensor,
    item_starts: Tensor,
    item_ends: Tensor,
    item_row_offsets: Tensor,
    *,
    num_rows: int,
    max_rows_per_item: int,
    max_len: int,
    scale: float,
    block_m: int = 128,
    block_n: int | None = None,
    num_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Run the item kernel (module docstring). Host ints size the grid; no device sync.

    q [B, Hq, D]; caches [num_blocks, Hkv, block_size, D] (last dim contiguous); tables int32
    [B, W]; row_requests [num_rows]; item_* [num_items] (item_row_offsets [num_items + 1], CSR
    over rows); max_len bounds end - start of every item. Returns the KV-split partials
    (o [S, num_rows, Hq, D] fp32, lse [S, num_rows, Hq] fp32), S = number of splits.
    """
    _, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("KV caches need a contiguous last dimension")
    block_n = block_n or kv_tile_len(k_cache)
    block_r = max(1, min(block_m // group, triton.next_power_of_2(max_rows_per_item)))
    # tl.dot wants M >= 16; a big group gets 128-row tiles (8 warps), so that each prefix
    # K/V tile serves as many stacked queries as possible
    block_m = max(16, triton.next_power_of_2(block_r * group))
    num_items, num_tiles = item_starts.numel(), -(-max_rows_per_item // block_r)
    if num_splits is None:
        num_splits = choose_splits(num_items * num_tiles * num_kv_heads, max_len, block_n, q.device)
    split_len = -(-max(max_len, 1) // (num_splits * block_n)) * block_n
    o = torch.empty(
        num_splits, num_rows, num_q_heads, head_dim, device=q.device, dtype=torch.float32
    )
    lse = torch.empty(num_splits, num_rows, num_q_heads, device=q.device, dtype=torch.float32)
    q = q.contiguous()
    grid = (num_items, num_tiles, num_kv_heads * num_splits)
    _paged_items_kernel[grid](
        q,
        k_cache,
        v_cache,
        o,
        lse,
        tables,
        row_requests,
        item_table_rows,
        item_starts,
        item_ends,
        item_row_offsets,
        q.stride(0),
        q.stride(1),
        *cache_strides(k_cache),
        *cache_strides(v_cache),
        *o.stride()[:3],
        *lse.stride()[:2],
        tables.stride(0),
        scale * LOG2E,
        split_len,
        block_size,
        num_splits,
        GROUP=group,
        BLOCK_R=block_r,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HEAD_DIM=head_dim,
        **dot_flags(q.dtype),
        num_warps=8 if block_m >= 128 else 4,
        num_stages=2,
    )
    return o, lse


def request_partials(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    *,
    kv_starts: Tensor | None,
    max_len: int,
    num_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Partials of request i's query over its tokens [kv_starts[i] (0), seq_lens[i]).

    q [B, Hq, D]; max_len: host bound on seq_lens - kv_starts. Returns (o [S, B, Hq, D],
    lse [S, B, Hq]) fp32. Caches its index tensors in ``plan.scratch``.
    """
    batch = q.shape[0]
    ids = plan.scratch.cached(
        ("triton_ids", q.device),
        lambda: torch.arange(batch + 1, device=q.device, dtype=torch.int32),
    )
    starts = (
        kv_starts
        if kv_starts is not None
        else plan.scratch.cached(
            ("triton_zeros", q.device), lambda: torch.zeros_like(plan.seq_lens)
        )
    )
    return paged_items_partials(
        q,
        k_cache,
        v_cache,
        plan.block_tables,
        ids[:batch],
        ids[:batch],
        starts,
        plan.seq_lens,
        ids,
        num_rows=batch,
        max_rows_per_item=1,
        max_len=max_len,
        scale=scale,
        num_splits=num_splits,
    )


def paged_decode_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    *,
    num_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Plain paged decode: q [B, Hq, D] -> (o [B, Hq, D] in q's dtype, lse [B, Hq] fp32)."""
    o_parts, lse_parts = request_partials(
        q,
        k_cache,
        v_cache,
        plan,
        scale,
        kv_starts=None,
        max_len=plan.max_seq_len,
        num_splits=num_splits,
    )
    return combine_partials(o_parts, lse_parts, q.dtype)
