"""Attention plans: built ONCE per engine step from plain Python lists, then read by every layer.

A plan holds the step's block tables and lengths as device tensors, plus the host-side sizes
(maximum lengths, block counts) that the kernels need for shapes and grids, so no layer ever
synchronises with the device to learn them.

Cascade grouping (``plan_decode(..., cascade=True)``) works on PHYSICAL block ids: the engine's
prefix cache shares blocks physically, so two requests whose block tables start with the same
ids see identical KV there. We insert every request's full blocks into a trie keyed by block id,
compress single-path chains (a radix tree), and walk it from the root:

* a node whose requests (>= ``CASCADE_MIN_GROUP_SIZE``) share a span of at least
  ``CASCADE_MIN_SHARED_TOKENS`` tokens not yet covered by an ancestor group becomes a group:
  that span's KV is read once for all its requests' queries;
* a span too short to pay is handed down: the child groups start where the last emitted
  ancestor group ended, so nothing is dropped;
* nested groups (system prompt -> document -> branch) get increasing ``level`` numbers; the
  groups of one level have disjoint requests;
* a request's own suffix starts where its deepest group ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from eclectus.kernels.gather import Scratch
from eclectus.kernels.table_cache import BlockTableCache, table_tensor

# A group of one request shares nothing.
CASCADE_MIN_GROUP_SIZE = 2
# Below this many shared tokens the extra pass plus the LSE merge costs more than the KV reads
# it saves (a decode step reads ~2 * Hkv * D * 2 bytes per token per request).
CASCADE_MIN_SHARED_TOKENS = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _table_tensor(block_tables: list[list[int]], device: torch.device) -> Tensor:
    """Pad ragged block tables with block 0 into int32 [batch, max_blocks_per_seq] (pure).

    A list object given for several rows (a prefill chunk's tokens attending as decode rows
    all read their request's table) is converted once and its row repeated by index: building
    a tensor from Python ints costs ~0.1 us each, 30 ms for 2,048 rows of 66 blocks."""
    width = max((len(t) for t in block_tables), default=0)
    first_row: dict[int, int] = {}  # id() of a table -> its row among the distinct tables
    index = [first_row.setdefault(id(t), len(first_row)) for t in block_tables]
    distinct = list({id(t): t for t in block_tables}.values())  # first-appearance order
    table = table_tensor(distinct, width, device)
    if len(distinct) == len(block_tables):
        return table
    return table[torch.tensor(index, device=device)]


def _check_lengths(block_tables: list[list[int]], seq_lens: list[int], block_size: int) -> None:
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if len(block_tables) != len(seq_lens):
        raise ValueError(f"{len(block_tables)} block tables but {len(seq_lens)} seq_lens")
    for i, (table, n) in enumerate(zip(block_tables, seq_lens, strict=True)):
        if n < 1 or len(table) < _cdiv(n, block_size):
            raise ValueError(
                f"request {i}: seq_len {n} needs {_cdiv(n, block_size)} blocks, "
                f"table has {len(table)}"
            )


@dataclass(slots=True)
class PrefillPlan:
    """Chunked-prefill step: request i has ``query_lens[i]`` new tokens (already in the cache)
    at the end of its ``seq_lens[i]`` tokens of context; queries are packed request after
    request. Immutable once built."""

    block_tables: Tensor  # int32 [batch, max_blocks_per_seq], padded with 0
    cu_query_lens: Tensor  # int32 [batch + 1]: request i's queries are rows [cu[i], cu[i+1])
    seq_lens: Tensor  # int32 [batch]
    query_lens_list: tuple[int, ...]  # host copies, for loops and shapes
    seq_lens_list: tuple[int, ...]
    block_size: int
    max_query_len: int
    max_seq_len: int

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens_list)


def plan_prefill(
    block_tables: list[list[int]],
    query_lens: list[int],
    seq_lens: list[int],
    block_size: int,
    device: torch.device,
) -> PrefillPlan:
    """Build the prefill plan (pure: reads lists, allocates small device tensors)."""
    _check_lengths(block_tables, seq_lens, block_size)
    if len(query_lens) != len(seq_lens):
        raise ValueError(f"{len(query_lens)} query_lens but {len(seq_lens)} seq_lens")
    for i, (q, n) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if not 0 <= q <= n:
            raise ValueError(f"request {i}: query_len {q} not in [0, seq_len={n}]")
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    return PrefillPlan(
        block_tables=_table_tensor(block_tables, device),
        cu_query_lens=torch.tensor(cu, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_lens_list=tuple(query_lens),
        seq_lens_list=tuple(seq_lens),
        block_size=block_size,
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
    )


@dataclass(frozen=True, slots=True)
class CascadeGroup:
    """Requests whose KV agrees on blocks [start_block, end_block) of their tables."""

    level: int  # 0 = outermost shared prefix; nested groups count up
    request_ids: tuple[int, ...]  # batch indices, ascending
    start_block: int  # first block index (in every member's table) this group covers
    end_block: int  # exclusive
    table_row: int  # a member whose block table row holds the group's block ids

    @property
    def num_blocks(self) -> int:
        return self.end_block - self.start_block


def _common_blocks(rows: list[list[int]]) -> int:
    """Length of the longest common prefix of ``rows`` (pure). The lexicographic minimum and
    maximum share exactly the prefix that all rows share, and comparing lists runs in C."""
    lo, hi = min(rows), max(rows)
    n = min(len(lo), len(hi))
    if lo[:n] == hi[:n]:
        return n
    i = 0
    while lo[i] == hi[i]:
        i += 1
    return i


def _split(rows: list[list[int]], requests: Iterable[int], depth: int) -> list[list[int]]:
    """The requests with a full block at ``depth``, split by its id, in order of first
    appearance (pure): the trie's children below a node that ends at ``depth``."""
    children: dict[int, list[int]] = {}
    for i in requests:
        if len(rows[i]) > depth:  # full blocks only: a partial block may diverge
            children.setdefault(rows[i][depth], []).append(i)
    return list(children.values())


def find_cascade_groups(
    block_tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    *,
    min_shared_tokens: int = CASCADE_MIN_SHARED_TOKENS,
    min_group_size: int = CASCADE_MIN_GROUP_SIZE,
) -> tuple[list[CascadeGroup], list[int]]:
    """Group requests by shared leading physical blocks (see the module docstring).

    Returns (groups, suffix_starts): groups in pre-order (a parent before its children);
    ``suffix_starts[i]`` is the first token position of request i not covered by a group.
    Pure function.

    The trie is walked without building it: a node is a set of requests that agree on their
    first ``depth`` full blocks; its children split that set by the block at ``depth``, and a
    child's radix-compressed span runs as far as all its requests still agree (the longest
    common prefix of their full-block rows). Children keep the order of their first request.
    """
    rows = [table[: n // block_size] for table, n in zip(block_tables, seq_lens, strict=True)]
    suffix_starts = [0] * len(seq_lens)
    groups: list[CascadeGroup] = []
    # stack of (a node's requests, first block not covered by a group, level of a group here)
    stack = [(members, 0, 0) for members in reversed(_split(rows, range(len(rows)), 0))]
    while stack:
        members, start, level = stack.pop()
        if len(members) < min_group_size:
            continue  # deeper nodes have even fewer requests
        end = _common_blocks([rows[i] for i in members])
        if (end - start) * block_size >= min_shared_tokens:
            groups.append(CascadeGroup(level, tuple(members), start, end, members[0]))
            for i in members:
                suffix_starts[i] = end * block_size
            start, level = end, level + 1
        stack.extend((child, start, level) for child in reversed(_split(rows, members, end)))
    return groups, suffix_starts


@dataclass(frozen=True, slots=True)
class CascadePlan:
    """The shared-prefix work of a decode step, host-side only (each backend builds the
    device tensors it reads, once per step, in the plan's scratch). Immutable.

    Membership rows: group after group (pre-order), each group's requests ascending; row m
    is request ``member_request_ids[m]`` attending to its group's blocks.
    """

    groups: tuple[CascadeGroup, ...]
    suffix_starts: tuple[int, ...]  # per request: first token of its own suffix
    block_size: int
    num_levels: int
    max_group_size: int
    max_group_tokens: int
    max_suffix_blocks: int  # blocks spanned by the widest suffix window

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def member_request_ids(self) -> tuple[int, ...]:
        return tuple(i for g in self.groups for i in g.request_ids)


@dataclass(frozen=True, slots=True)
class CascadeTables:
    """The cascade as the Triton kernels read it: int32 device tensors, CSR in both
    directions between groups, membership rows and requests. Immutable."""

    member_request_ids: Tensor  # [num_members]
    group_member_offsets: Tensor  # [num_groups + 1]: CSR into membership rows
    group_table_rows: Tensor  # [num_groups]: a member whose table row holds the group's blocks
    group_starts: Tensor  # [num_groups], tokens (multiple of block_size)
    group_ends: Tensor  # [num_groups], tokens, exclusive
    suffix_starts: Tensor  # [batch]
    request_member_offsets: Tensor  # [batch + 1]: CSR from request to its rows
    request_member_rows: Tensor  # [num_members]


def cascade_tables(cascade: CascadePlan, device: torch.device) -> CascadeTables:
    """Build the Triton path's tensors from the host-side plan (pure)."""
    members = cascade.member_request_ids
    offsets = [0]
    for g in cascade.groups:
        offsets.append(offsets[-1] + len(g.request_ids))
    rows_of: list[list[int]] = [[] for _ in cascade.suffix_starts]
    for row, i in enumerate(members):
        rows_of[i].append(row)
    request_offsets = [0]
    for rows in rows_of:
        request_offsets.append(request_offsets[-1] + len(rows))

    def ints(values: Sequence[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    bs = cascade.block_size
    return CascadeTables(
        member_request_ids=ints(members),
        group_member_offsets=ints(offsets),
        group_table_rows=ints([g.table_row for g in cascade.groups]),
        group_starts=ints([g.start_block * bs for g in cascade.groups]),
        group_ends=ints([g.end_block * bs for g in cascade.groups]),
        suffix_starts=ints(cascade.suffix_starts),
        request_member_offsets=ints(request_offsets),
        request_member_rows=ints([row for rows in rows_of for row in rows]),
    )


@dataclass(slots=True)
class DecodePlan:
    """A decode step: one query per request, at position seq_lens[i] - 1. Immutable except
    for ``scratch``."""

    block_tables: Tensor  # int32 [batch, max_blocks_per_seq], padded with 0
    seq_lens: Tensor  # int32 [batch]
    seq_lens_list: tuple[int, ...]
    block_size: int
    max_seq_len: int
    max_blocks: int  # ceil(max_seq_len / block_size)
    cascade: CascadePlan | None  # None: plain paged attention pays best (the one place
    # that decides it: build_decode_plan)
    # the index tensors each backend derives from the plan, built by the first layer that
    # needs them (the only mutable part of a plan)
    scratch: Scratch = field(default_factory=Scratch, repr=False, compare=False)

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens_list)

    def require_cascade(self) -> CascadePlan:
        """The cascade part, for the shared-prefix paths; ValueError when the plan has none."""
        if self.cascade is None:
            raise ValueError("plan has no cascade groups; use paged decode")
        return self.cascade


def _cascade_plan(
    seq_lens: list[int], block_size: int, groups: list[CascadeGroup], suffix_starts: list[int]
) -> CascadePlan:
    suffix_blocks = [
        _cdiv(n, block_size) - s // block_size for n, s in zip(seq_lens, suffix_starts, strict=True)
    ]
    return CascadePlan(
        groups=tuple(groups),
        suffix_starts=tuple(suffix_starts),
        block_size=block_size,
        num_levels=1 + max(g.level for g in groups),
        max_group_size=max(len(g.request_ids) for g in groups),
        max_group_tokens=max(g.num_blocks for g in groups) * block_size,
        max_suffix_blocks=max(1, *suffix_blocks),
    )


def _may_share(block_tables: list[list[int]], seq_lens: list[int], block_size: int) -> bool:
    """Whether two requests share their first full block: without that no group can form,
    and the trie (~20 us per request) is skipped."""
    firsts = [t[0] for t, n in zip(block_tables, seq_lens, strict=True) if n >= block_size]
    return len(set(firsts)) < len(firsts)


def build_decode_plan(
    block_tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    device: torch.device,
    *,
    cascade: bool = True,
    min_shared_tokens: int = CASCADE_MIN_SHARED_TOKENS,
    min_group_size: int = CASCADE_MIN_GROUP_SIZE,
    table_cache: BlockTableCache | None = None,
) -> DecodePlan:
    """:func:`plan_decode` with the grouping thresholds exposed (tests, benchmarks). Pure
    unless ``table_cache`` is given (see :func:`plan_decode`)."""
    _check_lengths(block_tables, seq_lens, block_size)
    cascade_plan = None
    if cascade and (min_group_size < 2 or _may_share(block_tables, seq_lens, block_size)):
        groups, suffix_starts = find_cascade_groups(
            block_tables,
            seq_lens,
            block_size,
            min_shared_tokens=min_shared_tokens,
            min_group_size=min_group_size,
        )
        if groups:
            cascade_plan = _cascade_plan(seq_lens, block_size, groups, suffix_starts)
    max_seq_len = max(seq_lens, default=0)
    if table_cache is None:
        tables = _table_tensor(block_tables, device)
    else:
        tables = table_cache.tensor(block_tables, device)
    return DecodePlan(
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        seq_lens_list=tuple(seq_lens),
        block_size=block_size,
        max_seq_len=max_seq_len,
        max_blocks=_cdiv(max_seq_len, block_size),
        cascade=cascade_plan,
    )


def plan_decode(
    block_tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    device: torch.device,
    *,
    cascade: bool = True,
    thresholds: tuple[int, int] = (CASCADE_MIN_SHARED_TOKENS, CASCADE_MIN_GROUP_SIZE),
    table_cache: BlockTableCache | None = None,
) -> DecodePlan:
    """Build the decode plan for one step (pure: reads lists, allocates small device tensors;
    with ``table_cache`` the block-table tensor is the cache's, patched in place from the last
    step's: MUTATES the cache and the previous plan built on it).

    One query per request at position ``seq_lens[i] - 1`` (already stored in the cache). With
    ``cascade=True`` requests sharing leading physical blocks are grouped (module docstring)
    when the sharing pays: at least ``thresholds`` = (shared tokens, requests), which depend on
    the backend (``dispatch.cascade_thresholds``); ``cascade=False`` or no paying group gives
    plain paged attention.
    """
    min_shared_tokens, min_group_size = thresholds
    return build_decode_plan(
        block_tables,
        seq_lens,
        block_size,
        device,
        cascade=cascade,
        min_shared_tokens=min_shared_tokens,
        min_group_size=min_group_size,
        table_cache=table_cache,
    )
