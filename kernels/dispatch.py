"""The functions the engine calls: each picks the Triton kernel, the native CPU kernel or the
torch path.

Triton runs when q is on a CUDA device and triton imports, or when ``ECLECTUS_KERNELS=triton``
forces it (CPU tensors under ``TRITON_INTERPRET=1``, for tests). On the CPU, fp32 decode
attention and the KV store run the compiled kernels of :mod:`eclectus.kernels.native` when
they built, the rest the torch paths; ``ECLECTUS_KERNELS=native`` insists on that kernel (an
error where it cannot run), ``ECLECTUS_KERNELS=torch`` forces the torch paths. The variable is
read once, at the first kernel call (importing chooses nothing); :func:`force_backend`
switches the choice for a block of code (the benchmarks' A/B, tests).
Shapes (every function): caches [num_blocks, Hkv, block_size, D] (head-major blocks);
q [tokens, Hq, D] with Hq a multiple of Hkv; LSE natural log, [tokens, Hq], fp32; outputs in
q's dtype.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from eclectus.kernels import native, native_cascade, torch_ops
from eclectus.kernels.plans import (
    CASCADE_MIN_GROUP_SIZE,
    CASCADE_MIN_SHARED_TOKENS,
    DecodePlan,
    PrefillPlan,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None
ENV_BACKEND = "ECLECTUS_KERNELS"  # "triton" | "native" | "torch" | unset (auto)
BACKENDS = ("", "triton", "native", "torch")  # "": auto


def _checked_backend(name: str) -> str:
    name = name.lower()
    if name not in BACKENDS:
        raise ValueError(
            f"{ENV_BACKEND} must be one of triton, native, torch or empty, not {name!r}"
        )
    return name


_forced: str | None = None  # the process-wide choice; None: not read from the environment yet


def _backend() -> str:
    """The process-wide choice, read from ``ECLECTUS_KERNELS`` at the first call (mutates the
    cached choice once; ValueError for a value that is not a backend)."""
    global _forced
    if _forced is None:
        _forced = _checked_backend(os.environ.get(ENV_BACKEND, ""))
    return _forced


@contextlib.contextmanager
def force_backend(name: str) -> Iterator[None]:
    """Serve every kernel call inside the block with ``name`` ("" = auto), then restore the
    previous choice (mutates the process-wide choice; not thread-scoped)."""
    global _forced
    previous, _forced = _backend(), _checked_backend(name)
    try:
        yield
    finally:
        _forced = previous


def use_triton(q: Tensor) -> bool:
    """Whether the Triton kernels serve this call (see the module docstring)."""
    backend = _backend()
    if backend == "torch":
        return False
    if backend == "triton":
        if not HAS_TRITON:
            raise RuntimeError(f"{ENV_BACKEND}=triton but triton is not importable")
        return True
    return q.is_cuda and HAS_TRITON


def use_native(q: Tensor, k_cache: Tensor) -> bool:
    """Whether the compiled CPU kernel serves this decode call (see the module docstring)."""
    serves = q.dtype == torch.float32 and _native_allowed(k_cache)
    if _backend() == "native" and not serves:
        raise RuntimeError(
            f"{ENV_BACKEND}=native, but the native kernel cannot serve "
            f"{q.dtype} on {q.device} (fp32 CPU tensors and a C compiler are needed)"
        )
    return serves


def _native_allowed(k_cache: Tensor) -> bool:
    """Not switched off, an fp32 CPU cache, and the kernel built (pure)."""
    if _backend() in ("torch", "triton"):
        return False
    return k_cache.device.type == "cpu" and k_cache.dtype == torch.float32 and native.available()


# With the native prefix pass (native_cascade) a group pays from 8 requests over 256 shared
# tokens: `python -m eclectus.benchmarks.kernels.shared_prefix --threads 1` style grid, one
# layer, paged time / cascade time (CPU time, best of 15, docs/benchmarks.md): 8 requests 0.86x
# at 128 tokens, 1.18x at 256, 2.0x at 2,048; 4 requests 0.65-1.05x; 2 requests 0.4-0.63x;
# 16-64 requests 1.0-1.3x at 128 tokens, 1.2-1.6x at 256, 2.0-2.5x at 2,048.
NATIVE_CASCADE_THRESHOLDS = (256, 8)  # (min shared tokens, min group size)


def cascade_thresholds(k_cache: Tensor) -> tuple[int, int]:
    """(min shared tokens, min requests) for a shared prefix to pay as a cascade group on the
    backend that serves decode over this cache (pure)."""
    if _native_allowed(k_cache):
        return NATIVE_CASCADE_THRESHOLDS
    return CASCADE_MIN_SHARED_TOKENS, CASCADE_MIN_GROUP_SIZE


def row_prefill_pays(k_cache: Tensor) -> bool:
    """Whether short prefill chunks over a shared cached context should attend as decode rows
    grouped by the cascade (the engine's model runner asks): on the native CPU kernels, whose
    prefix pass reads a shared context once for all rows, where the torch prefill gathers it
    per request (pure)."""
    return _native_allowed(k_cache)


def _check_attention_args(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"want q [T, Hq, D] and caches [N, Hkv, bs, D], got q "
            f"{tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"head mismatch: q {tuple(q.shape)} vs cache {tuple(k_cache.shape)}")


def store_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write new tokens into the paged cache. MUTATES k_cache and v_cache.

    k, v [T, Hkv, D]; caches [num_blocks, Hkv, block_size, D]; slot_mapping int64 [T],
    slot = block_id * block_size + offset.
    """
    if _store_natively(k, v, k_cache, v_cache, slot_mapping):
        native.store_kv_native(k, v, k_cache, v_cache, slot_mapping)
        return
    block_size = k_cache.shape[2]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    # advanced indices around a slice: the indexed view is [T, Hkv, D], k's shape
    k_cache[blocks, :, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, :, offsets] = v.to(v_cache.dtype)


def _store_natively(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> bool:
    """Whether the C store serves this call: the native kernels' fp32 CPU cache, fp32 rows
    with a unit last stride, int64 slots (pure)."""
    return (
        _native_allowed(k_cache)
        and k.dtype == v.dtype == torch.float32
        and k.device.type == v.device.type == "cpu"
        and k.stride(-1) == v.stride(-1) == 1
        and k_cache.stride() == v_cache.stride()
        and k_cache.stride(3) == 1
        and slot_mapping.dtype == torch.int64
        and slot_mapping.is_contiguous()
    )


def merge_attention_states(
    o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Attention over the union of two disjoint key sets from each side's partial result.

    o_a, o_b [N, H, D]; lse_a, lse_b [N, H] fp32, NATURAL-log log-sum-exp of the scaled
    scores; an empty side has lse = -inf (both empty: o = 0, lse = -inf). Exact and stable
    (weights exp(lse_x - max)). Returns (o [N, H, D] in o_a's dtype, lse [N, H] fp32). Pure.
    """
    if use_triton(o_a):
        from eclectus.kernels.triton_merge import merge_attention_states_triton

        return merge_attention_states_triton(o_a, lse_a, o_b, lse_b)
    return torch_ops.merge_attention_states_torch(o_a, lse_a, o_b, lse_b)


def paged_decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
) -> tuple[Tensor, Tensor]:
    """Plain paged decode (ignores the plan's cascade): request i's query q[i] attends to all
    its seq_lens[i] tokens through its block table. q [B, Hq, D] -> (o [B, Hq, D], lse [B, Hq])."""
    _check_attention_args(q, k_cache, v_cache)
    if use_triton(q):
        from eclectus.kernels.triton_decode import paged_decode_triton

        return paged_decode_triton(q, k_cache, v_cache, plan, scale)
    window = native.decode_window if use_native(q, k_cache) else torch_ops.decode_window
    o, lse = window(q, k_cache, v_cache, plan, scale)
    return o.to(q.dtype), lse


def cascade_decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
) -> tuple[Tensor, Tensor]:
    """Shared-prefix decode: each group's prefix once for all its queries, each request's
    suffix on its own, all merged by LSE. Needs ``plan.cascade``. q [B, Hq, D] ->
    (o [B, Hq, D], lse [B, Hq] fp32); equal to paged attention over the whole sequences."""
    _check_attention_args(q, k_cache, v_cache)
    plan.require_cascade()
    if use_triton(q):
        from eclectus.kernels.triton_cascade import cascade_decode_triton

        return cascade_decode_triton(q, k_cache, v_cache, plan, scale)
    if use_native(q, k_cache):
        o, lse = native_cascade.cascade_decode_native(q, k_cache, v_cache, plan, scale)
        return o.to(q.dtype), lse
    return torch_ops.cascade_decode_torch(q, k_cache, v_cache, plan, scale)


def decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: DecodePlan, scale: float
) -> Tensor:
    """One decode step's attention for one layer: q [B, Hq, D] -> o [B, Hq, D] (q's dtype).

    Uses the shared-prefix path when the plan found paying groups, else plain paged. Mutates
    nothing but ``plan.scratch`` (torch paths: cached gather indices and buffers).
    """
    if plan.cascade is not None:
        return cascade_decode_attention(q, k_cache, v_cache, plan, scale)[0]
    return paged_decode_attention(q, k_cache, v_cache, plan, scale)[0]


def prefill_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: PrefillPlan, scale: float
) -> Tensor:
    """Prefill over a paged prefix: q [sum(query_lens), Hq, D] -> o, same shape and dtype.

    Query j of request i sits at position seq_lens[i] - query_lens[i] + j and attends to the
    request's cached positions <= its own (causal); its K/V must already be in the cache. Pure.
    """
    _check_attention_args(q, k_cache, v_cache)
    if use_triton(q):
        from eclectus.kernels.triton_prefill import prefill_triton

        return prefill_triton(q, k_cache, v_cache, plan, scale)
    return torch_ops.prefill_torch(q, k_cache, v_cache, plan, scale)
