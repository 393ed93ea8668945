"""The decode steps' block-table tensor kept across steps: always equal to one built anew."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.kernels import BlockTableCache, plan_decode
from eclectus.kernels.table_cache import table_tensor

CPU = torch.device("cpu")

# one step's change to the batch: (kind, which row, how many blocks)
_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["append", "join", "leave", "refill", "same", "swap"]),
        st.integers(0, 1_000),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=25,
)


def _fresh(blocks: Iterator[int], n: int) -> list[int]:
    return [next(blocks) for _ in range(n)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=0, max_size=6), _EVENTS)
def test_the_cached_tensor_equals_a_fresh_build_through_any_steps(
    lengths: list[int], events: list[tuple[str, int, int]]
) -> None:
    """Rows appending blocks, joining, leaving, being cleared and refilled (preemption),
    swapping places, or nothing at all: after every step the cache's tensor equals the
    table built from the lists, and the lists themselves are never changed by it."""
    ids = iter(range(1, 100_000))
    tables = [_fresh(ids, n) for n in lengths]
    cache = BlockTableCache()
    for kind, pick, n in events:
        i = pick % len(tables) if tables else 0
        if kind == "append" and tables:
            tables[i] += _fresh(ids, n)  # in place, as the block manager appends
        elif kind == "join":
            tables.insert(i, _fresh(ids, n))
        elif kind == "leave" and tables:
            tables.pop(i)
        elif kind == "refill" and tables:
            tables[i].clear()  # freed, then readmitted on other blocks, maybe as many
            tables[i] += _fresh(ids, n)
        elif kind == "swap" and len(tables) > 1:
            tables[0], tables[i] = tables[i], tables[0]
        before = [list(t) for t in tables]
        got = cache.tensor(tables, CPU)
        width = max((len(t) for t in tables), default=0)
        assert torch.equal(got, table_tensor(tables, width, CPU))
        assert tables == before


def test_a_decode_step_that_only_appends_writes_one_row_not_the_table() -> None:
    """64 requests, one of them takes a new block: one row patched, no rebuild; a step with
    no change writes nothing."""
    tables = [list(range(100 * r, 100 * r + 5)) for r in range(64)]
    cache = BlockTableCache()
    cache.tensor(tables, CPU)
    assert (cache.num_rebuilds, cache.num_patched_rows) == (1, 0)
    cache.tensor(tables, CPU)
    assert (cache.num_rebuilds, cache.num_patched_rows) == (1, 0)
    tables[7].append(9_999)  # the widest row now: the tensor widens, the rest is kept
    got = cache.tensor(tables, CPU)
    assert (cache.num_rebuilds, cache.num_patched_rows) == (1, 1)
    assert got.shape == (64, 6) and got[7, 5] == 9_999 and int(got[8, 5]) == 0


def test_plan_decode_with_a_cache_gives_the_plan_built_without_one() -> None:
    """The plan's tensors and cascade groups are the same with and without the cache, step
    after step, while the shared prefix's requests append blocks."""
    shared = list(range(1, 21))
    tables = [[*shared, 100 + r] for r in range(12)]
    lens = [20 * 4 + 2] * 12
    cache = BlockTableCache()
    for step in range(6):
        for r, table in enumerate(tables):
            if step % 2 and r % 3 == 0:
                table.append(1_000 + 10 * r + step)
                lens[r] = 4 * len(table) - 1
        plain = plan_decode(tables, lens, 4, CPU, thresholds=(8, 2))
        cached = plan_decode(tables, lens, 4, CPU, thresholds=(8, 2), table_cache=cache)
        assert torch.equal(cached.block_tables, plain.block_tables)
        assert torch.equal(cached.seq_lens, plain.seq_lens)
        assert cached.cascade == plain.cascade and cached.cascade is not None
