"""Triton shared-prefix (cascade) decode: three launches per layer.

1. every group's shared blocks against all its members' queries, stacked into tiles (the item
   kernel of ``triton_decode``: one item per group, all levels in ONE launch, KV split so few
   groups still fill the GPU);
2. each request's own suffix (the same kernel, one item per request, from suffix_starts);
3. one combine per request of its suffix partials and the partials of every group it belongs
   to, by LSE (``triton_merge.combine_partials``), written in q's dtype.
"""

from __future__ import annotations

from torch import Tensor

from eclectus.kernels.plans import CascadeTables, DecodePlan, cascade_tables
from eclectus.kernels.triton_decode import paged_items_partials, request_partials
from eclectus.kernels.triton_merge import combine_partials


def _tables(plan: DecodePlan, q: Tensor) -> CascadeTables:
    """The plan's cascade as kernel tensors, built by the first layer and kept in scratch."""
    cascade = plan.require_cascade()
    return plan.scratch.cached(
        ("cascade_tables", q.device), lambda: cascade_tables(cascade, q.device)
    )


def cascade_prefix_partials(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    num_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Step 1 alone: membership-row partials (o [S, M, Hq, D], lse [S, M, Hq]) fp32."""
    cascade, tables = plan.require_cascade(), _tables(plan, q)
    return paged_items_partials(
        q,
        k_cache,
        v_cache,
        plan.block_tables,
        tables.member_request_ids,
        tables.group_table_rows,
        tables.group_starts,
        tables.group_ends,
        tables.group_member_offsets,
        num_rows=tables.member_request_ids.numel(),
        max_rows_per_item=cascade.max_group_size,
        max_len=cascade.max_group_tokens,
        scale=scale,
        num_splits=num_splits,
    )


def cascade_decode_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    num_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Shared-prefix decode. q [B, Hq, D] -> (o [B, Hq, D] in q's dtype, lse [B, Hq] fp32).

    ``num_splits`` forces the KV split count of both passes (tests); None picks it.
    """
    cascade, tables = plan.require_cascade(), _tables(plan, q)
    o_mem, lse_mem = cascade_prefix_partials(q, k_cache, v_cache, plan, scale, num_splits)
    o_suf, lse_suf = request_partials(
        q,
        k_cache,
        v_cache,
        plan,
        scale,
        kv_starts=tables.suffix_starts,
        max_len=cascade.max_suffix_blocks * plan.block_size,
        num_splits=num_splits,
    )
    members = (o_mem, lse_mem, tables.request_member_offsets, tables.request_member_rows)
    return combine_partials(o_suf, lse_suf, q.dtype, members)
