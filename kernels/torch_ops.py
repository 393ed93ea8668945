"""Fast torch paths: what the dispatchers run on CPU (and anywhere Triton is unavailable).

Decode is vectorised over chunks of requests: a padded, head-major, block-granular gather of
each request's KV window into [c, Hkv, L, D] (``gather``), one batched matmul per side, a
length mask; chunks are sized so the gathered KV is still in cache when the matmuls read it.
The cascade path loops over GROUPS, not requests: a group's stacked queries
[Hkv, G * group, D] meet its prefix keys in one matmul, so the prefix KV is read once per
group. Prefill loops over requests (each
one is big) and uses scaled_dot_product_attention. Math in fp32; LSE natural log, fp32.
Nothing here mutates its inputs; a plan's ``scratch`` caches gather indices, and gathers
reuse per-thread pooled buffers (``gather``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from eclectus.kernels.gather import gather_head_major, head_major_rows
from eclectus.kernels.plans import DecodePlan, PrefillPlan


def merge_attention_states_torch(
    o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Exact, stable merge of two partial attentions over disjoint key sets.

    o [N, H, D], lse [N, H] fp32 natural log; a side with lse = -inf is empty. Returns
    (o in o_a's dtype, lse fp32). Both sides empty gives (0, -inf).
    """
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(m == -math.inf, 0.0, m)  # keeps exp() finite when both sides are empty
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    inv = torch.where(total > 0, 1.0 / total, 0.0)
    o = o_a.float() * (w_a * inv)[..., None] + o_b.float() * (w_b * inv)[..., None]
    return o.to(o_a.dtype), m + torch.log(total)


def combine_states_by_index(
    o_parts: Tensor, lse_parts: Tensor, index: Tensor, num_out: int
) -> tuple[Tensor, Tensor]:
    """Merge any number of partial states per output row: row ``index[m]`` gets part m.

    o_parts [M, H, D], lse_parts [M, H] fp32, index int64 [M] -> (o [num_out, H, D] fp32,
    lse [num_out, H] fp32). Rows with no non-empty part come out (0, -inf).
    """
    num_heads = lse_parts.shape[1]
    m = torch.full((num_out, num_heads), -math.inf, device=lse_parts.device)
    m = m.scatter_reduce(0, index[:, None].expand(-1, num_heads), lse_parts, "amax")
    m = torch.where(m == -math.inf, 0.0, m)
    w = torch.exp(lse_parts - m[index])  # [M, H]; empty parts weigh 0
    total = torch.zeros_like(m).index_add_(0, index, w)
    o = torch.zeros((num_out, *o_parts.shape[1:]), device=o_parts.device)
    o.index_add_(0, index, o_parts.float() * w[..., None])
    o = o * torch.where(total > 0, 1.0 / total, 0.0)[..., None]
    return o, m + torch.log(total)


def _softmax_av(scores: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """scores [..., M, L] fp32 (masked: -inf), v [..., L, D] -> (o [..., M, D], lse [..., M])."""
    o = scores.new_empty((*scores.shape[:-1], v.shape[-1]))
    lse = scores.new_empty(scores.shape[:-1])
    _softmax_av_into(scores, v, o, lse)
    return o, lse


def _softmax_av_into(scores: Tensor, v: Tensor, o: Tensor, lse: Tensor) -> None:
    """:func:`_softmax_av` writing into contiguous ``o`` and ``lse``.

    One fused ``softmax`` pass (about 3x faster on CPU than ``logsumexp`` plus a separate
    ``exp``, measured on a masked decode score tile); the LSE comes from its largest probability,
    exp(max - lse) = 1 / sum, so lse = max - log(p_max). Empty rows (all -inf) give NaN
    probabilities; their o and lse are set to (0, -inf) afterwards, on the small outputs only
    (matmul rows are independent, so the NaNs stay in those rows).
    """
    row_max = scores.amax(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    empty = row_max == -math.inf
    torch.sub(row_max, probs.amax(dim=-1).log_(), out=lse)
    lse.masked_fill_(empty, -math.inf)
    torch.matmul(probs, v, out=o)
    o.masked_fill_(empty[..., None], 0.0)


# Requests are gathered and attended in chunks whose gathered K (and V) stay under this many
# bytes, so the matmuls read the gather back from cache rather than memory: 1.2-1.4x faster
# per layer than one gather of the whole batch on the 2-core CPU (docs/benchmarks.md). Much
# smaller chunks pay more per-call overhead than they save.
DECODE_CHUNK_BYTES = 2 * 2**20


def decode_chunks(num_blocks: Sequence[int], block_bytes: int) -> list[tuple[int, int, int]]:
    """Split requests (request i's window spans ``num_blocks[i]`` blocks) into runs
    (start, end, width in blocks) whose padded gather, (end - start) * width * block_bytes, stays
    within DECODE_CHUNK_BYTES (a run holds at least one request). Pure, host-side."""
    chunks: list[tuple[int, int, int]] = []
    start, width = 0, 0
    for i, n in enumerate(num_blocks):
        wider = max(width, n, 1)
        if i > start and (i + 1 - start) * wider * block_bytes > DECODE_CHUNK_BYTES:
            chunks.append((start, i, width))
            start, wider = i, max(n, 1)
        width = wider
    if num_blocks:
        chunks.append((start, len(num_blocks), width))
    return chunks


def paged_decode_window_torch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    kv_starts: Sequence[int] | None = None,
    tag: str = "full",
) -> tuple[Tensor, Tensor]:
    """Request i's query attends to its tokens [kv_starts[i] (default 0), seq_lens[i]).

    q [B, Hq, D]; caches [num_blocks, Hkv, block_size, D]; ``kv_starts`` host ints. Requests
    run in chunks (DECODE_CHUNK_BYTES): gather the chunk's KV head-major into pooled buffers,
    one batched matmul per side, a length mask. Index tensors are cached in ``plan.scratch``
    under ``tag``. Returns (o [B, Hq, D] fp32, lse [B, Hq] fp32): fp32 so a cascade merges
    unrounded states.
    """
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1:3]
    chunks, rows, masked = plan.scratch.cached(
        (tag, num_kv_heads),
        lambda: _window_index(plan, kv_starts, num_kv_heads, k_cache[0].nbytes),
    )
    qg = q.view(batch, num_kv_heads, -1, head_dim).float() * scale
    o = torch.empty_like(qg)
    lse = torch.empty(qg.shape[:-1], device=q.device)
    for (start, end, width), chunk_rows in zip(chunks, rows, strict=True):
        k = gather_head_major(k_cache, chunk_rows, (tag, "k"))  # [c, Hkv, L, D]
        v = gather_head_major(v_cache, chunk_rows, (tag, "v"))
        scores = qg[start:end] @ k.transpose(-1, -2).float()  # [c, Hkv, group, L]
        scores.masked_fill_(masked[start:end, ..., : width * block_size], -math.inf)
        _softmax_av_into(scores, v.float(), o[start:end], lse[start:end])
    return o.view(batch, num_q_heads, head_dim), lse.view(batch, num_q_heads)


def _window_index(
    plan: DecodePlan, kv_starts: Sequence[int] | None, num_kv_heads: int, block_bytes: int
) -> tuple[list[tuple[int, int, int]], list[Tensor], Tensor]:
    """(chunks, per-chunk gather rows [c, Hkv, width] for gather_head_major, masked-out
    [B, 1, 1, L] bool) of the windows [kv_starts[i], seq_lens[i])."""
    bs, lens = plan.block_size, plan.seq_lens_list
    starts = list(kv_starts) if kv_starts is not None else [0] * len(lens)
    first = [s // bs for s in starts]
    widths = [-(-n // bs) - f for n, f in zip(lens, first, strict=True)]
    chunks = decode_chunks(widths, block_bytes)
    device = plan.seq_lens.device
    first_t = torch.tensor(first, device=device)
    max_width = max((w for _, _, w in chunks), default=1)
    cols = first_t[:, None] + torch.arange(max_width, device=device)
    table = plan.block_tables
    blocks = table.long().gather(1, cols.clamp_max(max(table.shape[1] - 1, 0)))
    rows = head_major_rows(blocks, num_kv_heads)  # [B, Hkv, max_width]
    pos = first_t[:, None] * bs + torch.arange(max_width * bs, device=device)
    starts_t = torch.tensor(starts, device=device)
    masked = (pos < starts_t[:, None]) | (pos >= plan.seq_lens[:, None])
    chunk_rows = [rows[a:b, :, :w].contiguous() for a, b, w in chunks]
    return chunks, chunk_rows, masked[:, None, None, :]


def cascade_prefix_torch(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
) -> tuple[Tensor, Tensor]:
    """Each group's queries against its shared blocks, one matmul per group and side.

    Returns membership-row states (o [num_members, Hq, D] fp32, lse [num_members, Hq] fp32),
    rows in the plan's membership order. Caches index tensors in ``plan.scratch``.
    """
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    outs, lses = [], []
    for size, request_ids, rows in plan.scratch.cached(
        ("groups", num_kv_heads), lambda: _group_index(plan, num_kv_heads)
    ):
        k = gather_head_major(k_cache, rows, "group_k")  # [Hkv, L, D], read once
        v = gather_head_major(v_cache, rows, "group_v")
        # stack the group's queries into one tile per kv head: [Hkv, size * group, D]
        qg = q[request_ids].view(size, num_kv_heads, group, head_dim).transpose(0, 1)
        qg = qg.reshape(num_kv_heads, size * group, head_dim).float() * scale
        o, lse = _softmax_av(qg @ k.transpose(-1, -2).float(), v.float())
        outs.append(
            o.view(num_kv_heads, size, group, head_dim)
            .transpose(0, 1)
            .reshape(size, num_q_heads, head_dim)
        )
        lses.append(lse.view(num_kv_heads, size, group).transpose(0, 1).reshape(size, -1))
    return torch.cat(outs), torch.cat(lses)


def _group_index(plan: DecodePlan, num_kv_heads: int) -> list[tuple[int, Tensor, Tensor]]:
    """Per cascade group: (size, request ids int64 [size], gather rows [Hkv, num_blocks]);
    the group's physical blocks are read from a member's block table row."""
    device = plan.block_tables.device
    out = []
    for g in plan.require_cascade().groups:
        blocks = plan.block_tables[g.table_row, g.start_block : g.end_block]
        request_ids = torch.tensor(g.request_ids, dtype=torch.int64, device=device)
        out.append((len(g.request_ids), request_ids, head_major_rows(blocks, num_kv_heads)))
    return out


class DecodeWindow(Protocol):
    """Attention of each request's query over its tokens [kv_starts[i], seq_lens[i]) (all of
    them when kv_starts is None): (o [B, Hq, D] fp32, lse [B, Hq] fp32). ``tag`` names the
    window's cached indices in ``plan.scratch``."""

    def __call__(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        plan: DecodePlan,
        scale: float,
        kv_starts: Sequence[int] | None = None,
        tag: str = "full",
    ) -> tuple[Tensor, Tensor]: ...


decode_window: DecodeWindow = paged_decode_window_torch  # the torch path's window


class CascadePrefix(Protocol):
    """A cascade's shared-prefix pass: every group's members against its shared blocks,
    (o [num_members, Hq, D] fp32, lse [num_members, Hq] fp32) in membership-row order."""

    def __call__(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
    ) -> tuple[Tensor, Tensor]: ...


def cascade_decode_torch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    window: DecodeWindow = decode_window,
    prefix: CascadePrefix = cascade_prefix_torch,
) -> tuple[Tensor, Tensor]:
    """Shared-prefix decode: group passes (``prefix``), suffix pass (``window``), one
    scatter-logsumexp merge; ``prefix`` and ``window`` are this module's or the native
    kernel's.

    q [B, Hq, D] -> (o [B, Hq, D] in q's dtype, lse [B, Hq] fp32). Fills ``plan.scratch``.
    """
    cascade = plan.require_cascade()
    o_mem, lse_mem = prefix(q, k_cache, v_cache, plan, scale)
    o_suf, lse_suf = window(
        q, k_cache, v_cache, plan, scale, kv_starts=cascade.suffix_starts, tag="suffix"
    )
    batch = q.shape[0]
    index = plan.scratch.cached(
        "merge_index",
        lambda: torch.tensor(
            [*cascade.member_request_ids, *range(batch)], dtype=torch.int64, device=q.device
        ),
    )
    o, lse = combine_states_by_index(
        torch.cat([o_mem, o_suf]), torch.cat([lse_mem, lse_suf]), index, batch
    )
    return o.to(q.dtype), lse


def prefill_torch(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: PrefillPlan, scale: float
) -> Tensor:
    """Chunked prefill over paged context, one SDPA call per request.

    q [T, Hq, D] -> o [T, Hq, D] in q's dtype.
    """
    num_kv_heads, block_size, head_dim = k_cache.shape[1:]
    out = torch.empty_like(q)
    row = 0
    for i, (nq, n) in enumerate(zip(plan.query_lens_list, plan.seq_lens_list, strict=True)):
        if nq == 0:
            continue
        rows = head_major_rows(plan.block_tables[i, : -(-n // block_size)], num_kv_heads)
        k = gather_head_major(k_cache, rows, "prefill_k")[None, :, :n]  # [1, Hkv, n, D]
        v = gather_head_major(v_cache, rows, "prefill_v")[None, :, :n]
        qi = q[row : row + nq].transpose(0, 1)[None]  # [1, Hq, nq, D]
        if nq == n:  # no cached context: plain causal
            o = F.scaled_dot_product_attention(
                qi, k, v, is_causal=True, scale=scale, enable_gqa=True
            )
        elif 2 * nq > n:  # short cached context: pad the queries to a plain causal square
            # SDPA's is_causal is top-left aligned and skips the masked half (~n^2 / 2 work);
            # an explicit mask costs nq * n. Dummy rows in front of ours (each row is
            # computed on its own) line our queries up at positions n - nq ... n - 1.
            pad = qi.new_zeros(1, qi.shape[1], n - nq, head_dim)
            o = F.scaled_dot_product_attention(
                torch.cat([pad, qi], dim=2), k, v, is_causal=True, scale=scale, enable_gqa=True
            )[:, :, n - nq :]
        else:  # query j sits at n - nq + j: a bottom-right aligned causal mask
            keep = (
                torch.arange(n, device=q.device)[None, :]
                <= torch.arange(n - nq, n, device=q.device)[:, None]
            )
            o = F.scaled_dot_product_attention(
                qi, k, v, attn_mask=keep, scale=scale, enable_gqa=True
            )
        out[row : row + nq] = o[0].transpose(0, 1)
        row += nq
    return out
