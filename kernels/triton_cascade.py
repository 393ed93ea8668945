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

from eclectus.kernels.plans import CascadePlan, DecodePlan
from eclectus.kernels.triton_decode import paged_items_partials, request_partials
from eclectus.kernels.triton_merge import combine_partials


def _cascade_of(plan: DecodePlan) -> CascadePlan:
    if plan.cascade is None:
        raise ValueError("plan has no cascade groups; use paged decode")
    return plan.cascade


def cascade_prefix_partials(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    num_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Step 1 alone: membership-row partials (o [S, M, Hq, D], lse [S, M, Hq]) fp32."""
    cascade = _cascade_of(plan)
    return paged_items_partials(
        q,
        k_cache,
        v_cache,
        plan.block_tables,
        cascade.member_request_ids,
        cascade.group_table_rows,
        cascade.group_starts,
        cascade.group_ends,
        cascade.group_member_offsets,
        num_rows=cascade.member_request_ids.numel(),
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
    cascade = _cascade_of(plan)
    o_mem, lse_mem = cascade_prefix_partials(q, k_cache, v_cache, plan, scale, num_splits)
    o_suf, lse_suf = request_partials(
        q,
        k_cache,
        v_cache,
        plan,
        scale,
        kv_starts=cascade.suffix_starts,
        max_len=cascade.max_suffix_blocks * plan.block_size,
        num_splits=num_splits,
    )
    members = (o_mem, lse_mem, cascade.request_member_offsets, cascade.request_member_rows)
    return combine_partials(o_suf, lse_suf, q.dtype, members)
