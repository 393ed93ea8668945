"""Builders for paged-KV test batches that share prefixes the way the engine's cache does.

A request's prompt is a path of named segments (shared text) followed by a private tail. A
block is shared physically exactly when its whole token history up to its end is identical and
the block is full, as in a prefix cache; a prefix that ends mid-block is copied into private
blocks. Block ids are shuffled so tables are not contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PagedBatch:
    k_cache: Tensor  # [num_blocks, Hkv, block_size, D]
    v_cache: Tensor
    block_tables: list[list[int]]
    seq_lens: list[int]
    block_size: int


def make_batch(
    paths: list[tuple[str, ...]],
    segment_lens: dict[str, int],
    tail_lens: list[int],
    *,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedBatch:
    """One request per (path, tail_len); each must have at least one token."""
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> Tensor:
        return torch.randn(n, 2, num_kv_heads, head_dim, generator=gen)

    segment_kv = {name: rand(n) for name, n in sorted(segment_lens.items())}
    token_ids: list[list[tuple[object, int]]] = []  # identity of every token, per request
    token_kv: list[Tensor] = []
    for i, (path, tail) in enumerate(zip(paths, tail_lens, strict=True)):
        ids = [(name, j) for name in path for j in range(segment_lens[name])]
        ids += [(("tail", i), j) for j in range(tail)]
        parts = [segment_kv[name] for name in path] + [rand(tail)]
        token_ids.append(ids)
        token_kv.append(torch.cat(parts))
    key_to_block: dict[object, int] = {}
    logical: list[list[int]] = []
    for i, ids in enumerate(token_ids):
        row = []
        for b in range(-(-len(ids) // block_size)):
            end = (b + 1) * block_size
            full = end <= len(ids)
            key = tuple(ids[:end]) if full else ("private", i, b)  # prefix-cache rule
            row.append(key_to_block.setdefault(key, len(key_to_block)))
        logical.append(row)
    num_blocks = len(key_to_block) + spare_blocks
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[physical[b] for b in row] for row in logical]
    kv = torch.randn(num_blocks, block_size, 2, num_kv_heads, head_dim, generator=gen)
    for table, values in zip(tables, token_kv, strict=True):
        for p in range(values.shape[0]):
            kv[table[p // block_size], p % block_size] = values[p]
    head_major = kv.permute(2, 0, 3, 1, 4)  # [2, num_blocks, Hkv, block_size, D]
    return PagedBatch(
        head_major[0].contiguous().to(dtype),
        head_major[1].contiguous().to(dtype),
        tables,
        [len(ids) for ids in token_ids],
        block_size,
    )


def nested_batch(**kwargs: object) -> PagedBatch:
    """system prompt -> two documents -> branches, plus an unrelated request.

    Requests 0-2 share sys+docA (0 and 1 also share a branch), 3-4 share sys+docB, 5 has sys
    only with an empty tail, 6 shares nothing.
    """
    paths = [
        ("sys", "docA", "br"),
        ("sys", "docA", "br"),
        ("sys", "docA"),
        ("sys", "docB"),
        ("sys", "docB"),
        ("sys",),
        ("other",),
    ]
    segment_lens = {"sys": 21, "docA": 13, "docB": 8, "br": 9, "other": 5}
    return make_batch(paths, segment_lens, [3, 1, 6, 0, 7, 0, 2], **kwargs)  # type: ignore[arg-type]
