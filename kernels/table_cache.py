"""The decode step's block-table tensor, kept from step to step and patched where it changed.

Building ``int32 [batch, max_blocks]`` from Python lists costs ~0.05 us per id: 0.42 ms for
64 requests of 131 blocks, every step (docs/benchmarks.md, "A decode step's fixed costs"). From
one decode step to the next a request's table usually does not change at all, and when it does
a block was appended at its end. :class:`BlockTableCache` keeps the last tensor and a copy of
the lists it was built from; each step it compares every list with its copy (a list comparison
runs in C) and writes only the ids that are new. Rows joining or leaving, a table cleared and
refilled (preemption), a wider or narrower batch: each is detected by that comparison or by the
shape, and rebuilt, so the tensor always equals the one built from scratch.
"""

from __future__ import annotations

import torch
from torch import Tensor

# past this share of rewritten rows, one conversion of the whole table is cheaper than the
# per-row writes (~10 us each)
MAX_PATCHED_SHARE = 0.25


def table_tensor(block_tables: list[list[int]], width: int, device: torch.device) -> Tensor:
    """``block_tables`` padded with block 0 to ``width`` as int32 [batch, width] (pure)."""
    rows = [list(t) + [0] * (width - len(t)) for t in block_tables]
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(len(rows), width)


class BlockTableCache:
    """The block-table tensor of the previous call and the lists it holds (mutated by
    :meth:`tensor`). One owner (the engine's model runner) calls it once per decode step; the
    tensor it returns is written in place by the next call, so a plan built on it is good for
    one step only."""

    def __init__(self) -> None:
        self._rows: list[list[int]] = []  # copies of the lists the tensor holds
        self._table: Tensor | None = None
        self.num_rebuilds = 0  # whole-table conversions, ever (tests, benchmarks)
        self.num_patched_rows = 0  # rows written in place, ever

    def tensor(self, block_tables: list[list[int]], device: torch.device) -> Tensor:
        """int32 [batch, max len] equal to the tables padded with block 0 (mutates the cache
        and the tensor it returned last time)."""
        width = max((len(t) for t in block_tables), default=0)
        table = self._table
        if (
            table is None
            or table.device != device
            or table.shape[0] != len(block_tables)
            or table.shape[1] > width
        ):
            return self._rebuild(block_tables, width, device)
        if table.shape[1] < width:  # a longest request took a new block: widen, keep the rest
            wider = torch.zeros(len(block_tables), width, dtype=torch.int32, device=device)
            wider[:, : table.shape[1]] = table
            table = self._table = wider
        changed = [
            i for i, (t, old) in enumerate(zip(block_tables, self._rows, strict=True)) if t != old
        ]
        if len(changed) > MAX_PATCHED_SHARE * len(block_tables):
            return self._rebuild(block_tables, width, device)
        for i in changed:
            self._patch(i, block_tables[i], width, device)
        return table

    def _patch(self, i: int, new: list[int], width: int, device: torch.device) -> None:
        """Write row ``i``'s ids that differ from its copy (mutates)."""
        old = self._rows[i]
        assert self._table is not None
        keep = len(old) if len(new) >= len(old) and new[: len(old)] == old else 0
        tail = new[keep:] + [0] * (width - len(new)) if keep == 0 else new[keep:]
        self._table[i, keep : keep + len(tail)] = torch.tensor(
            tail, dtype=torch.int32, device=device
        )
        self._rows[i] = list(new)
        self.num_patched_rows += 1

    def _rebuild(self, block_tables: list[list[int]], width: int, device: torch.device) -> Tensor:
        self._table = table_tensor(block_tables, width, device)
        self._rows = [list(t) for t in block_tables]
        self.num_rebuilds += 1
        return self._table
