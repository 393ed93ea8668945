"""Plans: table padding, prefill offsets, and the trie grouping of shared physical blocks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import PagedBatch, make_batch, nested_batch

from eclectus.kernels import (
    build_decode_plan,
    cascade_tables,
    find_cascade_groups,
    plan_decode,
    plan_prefill,
)

CPU = torch.device("cpu")


def _groups(
    batch: PagedBatch,
    min_tokens: int,
) -> tuple[list[tuple[int, tuple[int, ...], int, int]], list[int]]:
    """((level, request_ids, start_block, end_block) per group, suffix_starts)."""
    groups, starts = find_cascade_groups(
        batch.block_tables, batch.seq_lens, batch.block_size, min_shared_tokens=min_tokens
    )
    return [(g.level, g.request_ids, g.start_block, g.end_block) for g in groups], starts


def test_nested_levels_form_one_group_per_shared_span() -> None:
    """sys -> docA -> branch nest as levels 0, 1, 2; docB is a sibling group at level 1."""
    groups, starts = _groups(nested_batch(block_size=4, num_kv_heads=1, head_dim=4), 4)
    assert groups == [
        (0, (0, 1, 2, 3, 4, 5), 0, 5),
        (1, (0, 1, 2), 5, 8),
        (2, (0, 1), 8, 10),
        (1, (3, 4), 5, 7),
    ]
    assert starts == [40, 40, 32, 28, 28, 20, 0]


def test_short_span_is_handed_down_to_children() -> None:
    """A shared span below the threshold joins its child group instead of being dropped."""
    groups, starts = _groups(nested_batch(block_size=4, num_kv_heads=1, head_dim=4), 16)
    assert groups == [(0, (0, 1, 2, 3, 4, 5), 0, 5), (1, (0, 1), 5, 10)]
    assert starts == [40, 40, 20, 20, 20, 20, 0]


def test_partial_blocks_are_never_grouped() -> None:
    """A prefix ending mid-block shares only its full blocks."""
    batch = make_batch(
        [("p",), ("p",)], {"p": 10}, [3, 5], block_size=4, num_kv_heads=1, head_dim=4
    )
    groups, starts = _groups(batch, 4)
    assert groups == [(0, (0, 1), 0, 2)]
    assert starts == [8, 8]


def test_identical_full_sequences_have_empty_suffixes() -> None:
    batch = make_batch([("p",), ("p",)], {"p": 8}, [0, 0], block_size=4, num_kv_heads=1, head_dim=4)
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, CPU, min_shared_tokens=4)
    assert plan.cascade is not None
    assert plan.cascade.suffix_starts == (8, 8)


def test_plan_decode_tensors_and_host_sizes() -> None:
    batch = nested_batch(block_size=4, num_kv_heads=1, head_dim=4)
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, CPU, min_shared_tokens=4)
    assert plan.block_tables.dtype == torch.int32
    assert plan.block_tables.shape == (7, 12)
    assert plan.max_seq_len == 46 and plan.max_blocks == 12
    cascade = plan.cascade
    assert cascade is not None and cascade.num_levels == 3 and cascade.num_groups == 4
    assert cascade.member_request_ids == (0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 3, 4)
    assert cascade.suffix_starts == (40, 40, 32, 28, 28, 20, 0)
    assert cascade.max_group_size == 6 and cascade.max_group_tokens == 20
    # widest suffix windows span 2 blocks: request 0 [40, 46), request 2 [32, 40), request 6
    assert cascade.max_suffix_blocks == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(1, 5))
def test_a_table_given_for_many_rows_is_padded_like_distinct_ones(
    picks: list[int], width: int
) -> None:
    """Rows that pass the same list object (a prefill chunk's tokens as decode rows) get the
    same tensor as distinct equal lists would: each row padded with 0 to the widest."""
    tables = [list(range(10 * i, 10 * i + width + i % 2)) for i in range(4)]
    rows = [tables[i] for i in picks]  # the same objects, repeated, in any order
    lens = [len(t) for t in rows]
    plan = plan_decode(rows, lens, 1, CPU, cascade=False)
    copies = [list(t) for t in rows]  # distinct objects
    assert torch.equal(plan.block_tables, plan_decode(copies, lens, 1, CPU).block_tables)
    widest = max(lens)
    assert plan.block_tables.tolist() == [t + [0] * (widest - len(t)) for t in rows]


def test_cascade_tables_for_the_triton_kernels() -> None:
    """The int32 CSR tensors the Triton path builds from a host-side cascade plan."""
    batch = nested_batch(block_size=4, num_kv_heads=1, head_dim=4)
    plan = build_decode_plan(batch.block_tables, batch.seq_lens, 4, CPU, min_shared_tokens=4)
    assert plan.cascade is not None
    tables = cascade_tables(plan.cascade, CPU)
    assert tables.member_request_ids.dtype == torch.int32
    assert tables.member_request_ids.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 3, 4]
    assert tables.group_member_offsets.tolist() == [0, 6, 9, 11, 13]
    # request -> its membership rows (CSR): request 0 is in rows 0, 6, 9; request 6 in none
    assert tables.request_member_offsets.tolist() == [0, 3, 6, 8, 10, 12, 13, 13]
    assert tables.request_member_rows.tolist() == [0, 6, 9, 1, 7, 10, 2, 8, 3, 11, 4, 12, 5]
    assert tables.group_starts.tolist() == [0, 20, 32, 20]
    assert tables.group_ends.tolist() == [20, 32, 40, 28]
    assert tables.group_table_rows.tolist() == [0, 0, 0, 3]
    assert tables.suffix_starts.tolist() == [40, 40, 32, 28, 28, 20, 0]


def test_no_sharing_or_cascade_off_gives_plain_plan() -> None:
    batch = nested_batch(block_size=4, num_kv_heads=1, head_dim=4)
    plan = plan_decode(batch.block_tables, batch.seq_lens, 4, CPU, cascade=False)
    assert plan.cascade is None
    with pytest.raises(ValueError, match="no cascade groups"):
        plan.require_cascade()
    lonely = make_batch(
        [("a",), ("b",)], {"a": 300, "b": 300}, [1, 1], block_size=4, num_kv_heads=1, head_dim=4
    )
    assert plan_decode(lonely.block_tables, lonely.seq_lens, 4, CPU).cascade is None


def test_plan_groups_exactly_when_a_first_full_block_is_shared() -> None:
    """The planner's shortcut (no shared first full block: no trie) agrees with the trie."""
    tables = [[7, 1, 2], [7, 3], [5, 4], [7]]
    for lens in ([12, 8, 8, 3], [12, 3, 8, 3], [2, 8, 8, 4]):
        groups, _ = find_cascade_groups(tables, lens, 4, min_shared_tokens=1)
        plan = build_decode_plan(tables, lens, 4, CPU, min_shared_tokens=1)
        assert (plan.cascade is not None) == bool(groups)
        assert plan.cascade is None or list(plan.cascade.groups) == groups


def test_default_thresholds_group_a_long_system_prompt() -> None:
    batch = make_batch(
        [("sys",)] * 3, {"sys": 1024}, [5, 9, 1], block_size=16, num_kv_heads=1, head_dim=4
    )
    plan = plan_decode(batch.block_tables, batch.seq_lens, 16, CPU)
    assert plan.cascade is not None
    assert [g.request_ids for g in plan.cascade.groups] == [(0, 1, 2)]


def test_plan_prefill_offsets() -> None:
    plan = plan_prefill([[3, 1], [2], [5, 6, 7]], [4, 2, 9], [6, 2, 10], 4, CPU)
    assert plan.cu_query_lens.tolist() == [0, 4, 6, 15]
    assert plan.max_query_len == 9 and plan.max_seq_len == 10 and plan.num_tokens == 15
    assert plan.block_tables.tolist() == [[3, 1, 0], [2, 0, 0], [5, 6, 7]]


@pytest.mark.parametrize(
    ("tables", "q", "n"), [([[1]], [1], [5]), ([[1]], [3], [2]), ([[1], [2]], [1], [1, 1])]
)
def test_plans_reject_bad_lengths(tables: list[list[int]], q: list[int], n: list[int]) -> None:
    with pytest.raises(ValueError):
        plan_prefill(tables, q, n, 4, CPU)


def _trie_groups(
    tables: list[list[int]], lens: list[int], bs: int, min_tokens: int, min_size: int
) -> tuple[list[tuple[int, tuple[int, ...], int, int, int]], list[int]]:
    """The grouping spelled out with an explicit trie (the original implementation): insert
    each request's full blocks, collapse single-child chains with the same requests, walk in
    pre-order."""
    root: dict = {"depth": 0, "ids": [], "children": {}}
    for i, (table, n) in enumerate(zip(tables, lens, strict=True)):
        node = root
        for j in range(n // bs):
            fresh = {"depth": j + 1, "ids": [], "children": {}}
            node = node["children"].setdefault(table[j], fresh)
            node["ids"].append(i)
    starts, groups = [0] * len(lens), []
    stack = [(c, 0, 0) for c in reversed(root["children"].values())]
    while stack:
        node, start, level = stack.pop()
        while len(node["children"]) == 1:
            (only,) = node["children"].values()
            if len(only["ids"]) != len(node["ids"]):
                break
            node = only
        ids = node["ids"]
        if len(ids) < min_size:
            continue
        if (node["depth"] - start) * bs >= min_tokens:
            groups.append((level, tuple(ids), start, node["depth"], ids[0]))
            for i in ids:
                starts[i] = node["depth"] * bs
            start, level = node["depth"], level + 1
        stack.extend((c, start, level) for c in reversed(node["children"].values()))
    return groups, starts


@settings(max_examples=60, deadline=None)
@given(
    paths=st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=4), min_size=1, max_size=12),
    tails=st.lists(st.integers(0, 9), min_size=12, max_size=12),
    block_size=st.sampled_from([1, 2, 4]),
    min_tokens=st.sampled_from([1, 4, 9]),
    min_size=st.sampled_from([2, 3]),
)
def test_grouping_equals_an_explicit_trie_walk(
    paths: list[list[int]], tails: list[int], block_size: int, min_tokens: int, min_size: int
) -> None:
    """Random prefix forests (segment choices per level, shared by equal paths): the walk
    without a trie emits the same groups, in the same order, and the same suffix starts."""
    named = [tuple(f"{d}:{'.'.join(map(str, p[: d + 1]))}" for d in range(len(p))) for p in paths]
    lens = {name: 3 + sum(map(ord, name)) % 5 for path in named for name in path}
    batch = make_batch(
        [p or ("solo",) for p in named],
        lens | {"solo": 2},
        [max(1, t) if not p else t for p, t in zip(named, tails, strict=False)],
        block_size=block_size,
        num_kv_heads=1,
        head_dim=2,
    )
    groups, starts = find_cascade_groups(
        batch.block_tables,
        batch.seq_lens,
        block_size,
        min_shared_tokens=min_tokens,
        min_group_size=min_size,
    )
    got = [(g.level, g.request_ids, g.start_block, g.end_block, g.table_row) for g in groups]
    assert (got, starts) == _trie_groups(
        batch.block_tables, batch.seq_lens, block_size, min_tokens, min_size
    )
