"""Head-major KV gathers for the torch paths, and the per-step scratch that makes them cheap.

The cache layout [num_blocks, Hkv, block_size, D] makes each (block, kv head) one contiguous
[block_size, D] run, and a batched matmul wants each (request, kv head) as one contiguous
[L, D] matrix. So a gather is BLOCK-granular: ``index_select`` of whole runs (rows of
``cache.view(num_blocks * Hkv, block_size * D)``) lays out [..., Hkv, L, D] in one pass, with
block_size times fewer, block_size times bigger rows than a token-granular gather (measured
~1.2x faster out of cache on the 2-core CPU; docs/benchmarks.md).

Gathers write into reused buffers: fresh allocations page-fault for longer than the gather
itself takes (measured: ~8x on a 2-core CPU at 100 MB per layer). The buffers live in a
per-thread pool that outlives steps (a step's plan is new, its buffers are not); it holds the
largest gather seen so far, per key. Per thread, because calls within one thread are
sequential.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")
_POOL = threading.local()  # .buffers: dict[(key, dtype, device), flat Tensor]


def pooled_buffer(
    key: Hashable, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> Tensor:
    """An uninitialised [shape] view of this thread's buffer for ``key``, grown (with 25%
    headroom) when too small. The previous contents are garbage; mutates the pool."""
    buffers: dict[Hashable, Tensor] = _POOL.__dict__.setdefault("buffers", {})
    numel = 1
    for size in shape:
        numel *= size
    flat = buffers.get((key, dtype, device))
    # a buffer made under inference mode cannot be written outside it (the engine runs
    # under inference mode; tests and benchmarks call the kernels without it)
    stale = flat is not None and flat.is_inference() and not torch.is_inference_mode_enabled()
    if flat is None or flat.numel() < numel or stale:
        flat = torch.empty(numel + numel // 4, dtype=dtype, device=device)
        buffers[(key, dtype, device)] = flat
    return flat[:numel].view(shape)


class Scratch:
    """Tensors cached for one engine step and reused by every layer of it.

    Index tensors depend only on the plan (and Hkv), so they are built by the first layer
    and reused by the others. Methods mutate only the scratch itself.
    """

    def __init__(self) -> None:
        self._items: dict[Hashable, Any] = {}

    def cached(self, key: Hashable, make: Callable[[], T]) -> T:
        """The value stored under ``key``, built by ``make()`` on first use."""
        if key not in self._items:
            self._items[key] = make()
        return self._items[key]

    def __repr__(self) -> str:
        return f"Scratch({len(self._items)} items)"


def head_major_rows(blocks: Tensor, num_kv_heads: int) -> Tensor:
    """Row ids into ``cache.view(num_blocks * Hkv, block_size * D)`` that gather ``blocks``
    [..., nb] as [..., Hkv, nb] runs, i.e. [..., Hkv, nb * block_size, D] once viewed
    (int64): row = block * Hkv + head."""
    heads = torch.arange(num_kv_heads, device=blocks.device)[:, None]
    return blocks.long()[..., None, :] * num_kv_heads + heads  # [..., Hkv, nb]


def gather_head_major(cache: Tensor, rows: Tensor, key: Hashable = None) -> Tensor:
    """cache [num_blocks, Hkv, block_size, D], rows [..., Hkv, nb] (``head_major_rows``) ->
    [..., Hkv, nb * block_size, D].

    With a ``key`` the result is written into this thread's pooled buffer for it, and is only
    valid until the next gather with the same key; without one it is a fresh tensor.
    """
    num_blocks, num_kv_heads, block_size, head_dim = cache.shape
    flat = cache.reshape(num_blocks * num_kv_heads, block_size * head_dim)  # a view if contiguous
    shape = (*rows.shape[:-1], rows.shape[-1] * block_size, head_dim)
    index = rows.reshape(-1)
    if key is None:
        return flat.index_select(0, index).view(shape)
    out = pooled_buffer(key, (index.numel(), block_size * head_dim), cache.dtype, cache.device)
    torch.index_select(flat, 0, index, out=out)
    return out.view(shape)
