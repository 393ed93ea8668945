"""The cascade (shared-prefix decode) on the compiled CPU kernels of :mod:`native`.

Two calls per layer, both in C (``csrc/paged_decode.c``), neither of which copies KV:

1. the prefix pass: per (group, kv head), the stacked queries of all members meet each shared
   key/value tile once (an online-softmax matrix-matrix product), so a shared prefix costs
   one read from memory per step and layer, whatever the group's size;
2. the suffix pass and the merge in one: the native paged decode over each request's own
   tokens, joined with its groups' states (by LSE) before its values are summed, so o is
   written once and no separate merge pass reads it back.

The plan's cascade tables (``plans.cascade_tables``, int32) are built and bounds-checked once
per plan and cached in ``plan.scratch``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eclectus.kernels import native
from eclectus.kernels.plans import CascadeTables, DecodePlan, cascade_tables


def cascade_decode_native(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
) -> tuple[Tensor, Tensor]:
    """Shared-prefix decode: q [B, Hq, D] fp32 -> (o [B, Hq, D] fp32, lse [B, Hq] fp32),
    equal to paged attention over the whole sequences. Needs ``plan.cascade``; fills
    ``plan.scratch``. Raises like :func:`native.paged_decode_native`."""
    cascade = plan.require_cascade()
    q = q.contiguous()  # once for both passes (the model's q is a view into q and k heads)
    o_mem, lse_mem = cascade_prefix(q, k_cache, v_cache, plan, scale)
    tables = _tables(plan, k_cache)
    prefix = native.PrefixStates(
        o_mem, lse_mem, tables.request_member_offsets, tables.request_member_rows
    )
    return native.decode_window(
        q, k_cache, v_cache, plan, scale, cascade.suffix_starts, "suffix", prefix
    )


def _tables(plan: DecodePlan, k_cache: Tensor) -> CascadeTables:
    return plan.scratch.cached(
        ("native_cascade", k_cache.shape), lambda: _cascade_tables_checked(plan, k_cache)
    )


def cascade_prefix(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
) -> tuple[Tensor, Tensor]:
    """The cascade's shared-prefix pass on this kernel (``torch_ops.CascadePrefix``): each
    group's shared blocks are read once for the stacked queries of all its members.

    Returns membership-row states (o [num_members, Hq, D] fp32, lse [num_members, Hq] fp32),
    rows in the plan's membership order, like ``torch_ops.cascade_prefix_torch``. The plan's
    cascade tables are built and bounds-checked once per plan (cached in ``plan.scratch``).
    """
    tables = _tables(plan, k_cache)
    return _launch_prefix(q, k_cache, v_cache, plan.block_tables, tables, scale)


def _cascade_tables_checked(plan: DecodePlan, k_cache: Tensor) -> CascadeTables:
    """The plan's cascade as int32 CPU tensors, after checking that no group reads outside its
    table row or the cache."""
    cascade = plan.require_cascade()
    native._check_bounds(k_cache, plan.block_tables, plan.seq_lens, None, plan.block_size)
    width = plan.block_tables.shape[1]
    for g in cascade.groups:
        if not (0 <= g.table_row < plan.num_requests and 0 <= g.start_block <= g.end_block):
            raise ValueError(f"cascade group {g} outside the plan's {plan.num_requests} rows")
        if g.end_block > width or not all(0 <= i < plan.num_requests for i in g.request_ids):
            raise ValueError(f"cascade group {g} outside the plan's tables (width {width})")
    tables = cascade_tables(cascade, torch.device("cpu"))
    native.check_prefix_rows(  # the suffix pass joins the prefix pass's rows through these
        tables.request_member_offsets,
        tables.request_member_rows,
        tables.member_request_ids.shape[0],
        plan.num_requests,
    )
    return tables


def _launch_prefix(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    tables: CascadeTables,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """Call the prefix-pass kernel on checked tables."""
    lib = native.loaded_library()
    _, num_q_heads, head_dim = q.shape
    native._check(q, k_cache, v_cache, block_tables, tables.member_request_ids, None)
    q, block_tables = q.contiguous(), block_tables.contiguous()
    num_members = tables.member_request_ids.shape[0]
    o = torch.empty(num_members, num_q_heads, head_dim, dtype=torch.float32)
    lse = torch.empty(num_members, num_q_heads, dtype=torch.float32)
    status = lib.cascade_prefix_f32(
        *native.cache_args(q, k_cache, v_cache),
        block_tables.data_ptr(),
        block_tables.stride(0),
        tables.member_request_ids.data_ptr(),
        tables.group_member_offsets.data_ptr(),
        tables.group_table_rows.data_ptr(),
        tables.group_starts.data_ptr(),
        tables.group_ends.data_ptr(),
        o.data_ptr(),
        lse.data_ptr(),
        tables.group_table_rows.shape[0],
        *native.shape_args(q, k_cache, scale),
    )
    if status != 0:
        raise MemoryError("native cascade prefix kernel: scratch allocation failed")
    return o, lse
