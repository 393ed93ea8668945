"""The native decode kernel's prefix join (``native.PrefixStates``: the cascade's suffix pass
and merge in one pass) against the window's reference attention merged with each prefix state
by the reference merge."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import PagedBatch, make_batch

from eclectus.kernels import native, ref_paged_decode
from eclectus.kernels.reference import ref_merge_attention_states

pytestmark = pytest.mark.skipif(not native.available(), reason="no working C compiler")


def _ints(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _tables(batch: PagedBatch) -> torch.Tensor:
    width = max(len(t) for t in batch.block_tables)
    return _ints([t + [0] * (width - len(t)) for t in batch.block_tables])  # type: ignore[arg-type]


def _states(
    rows_of: list[list[int]], num_states: int, num_q_heads: int, head_dim: int, seed: int
) -> native.PrefixStates:
    """Random states (a few empty: lse = -inf, o = 0) and the request -> rows tables."""
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(num_states, num_q_heads, head_dim, generator=gen)
    lse = torch.randn(num_states, num_q_heads, generator=gen) * 4
    empty = torch.arange(num_states) % 3 == 2
    o[empty], lse[empty] = 0.0, -math.inf
    offsets = [0]
    for rows in rows_of:
        offsets.append(offsets[-1] + len(rows))
    return native.PrefixStates(o, lse, _ints(offsets), _ints([r for rs in rows_of for r in rs]))


def _assert_join(
    batch: PagedBatch, q: torch.Tensor, scale: float, starts: list[int], prefix: native.PrefixStates
) -> None:
    """The kernel's (o, lse) equal the reference window folded with each prefix state."""
    o, lse = native.paged_decode_native(
        q,
        batch.k_cache,
        batch.v_cache,
        _tables(batch),
        _ints(batch.seq_lens),
        scale,
        _ints(starts),
        prefix,
    )
    o_ref, lse_ref = ref_paged_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, scale, starts
    )
    offsets = prefix.request_offsets.tolist()
    for b in range(q.shape[0]):
        want = (o_ref[b : b + 1], lse_ref[b : b + 1])
        for row in prefix.request_rows[offsets[b] : offsets[b + 1]].tolist():
            want = ref_merge_attention_states(
                *want, prefix.o[row : row + 1], prefix.lse[row : row + 1]
            )
        torch.testing.assert_close(o[b : b + 1], want[0], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(lse[b : b + 1], want[1], atol=2e-5, rtol=2e-5)


def test_empty_windows_and_states() -> None:
    """An empty window takes its prefixes' union; with only empty states too it is (0, -inf)."""
    batch = make_batch(
        [("p",)] * 4, {"p": 8}, [3, 0, 5, 0], block_size=4, num_kv_heads=2, head_dim=16
    )
    q = torch.randn(4, 4, 16, generator=torch.Generator().manual_seed(0))
    starts = [8, 8, 8, 8]  # request 1 and 3: empty windows
    prefix = _states([[0, 1], [0, 1], [], [2]], 3, 4, 16, seed=1)  # row 2: an empty state
    _assert_join(batch, q, 0.25, starts, prefix)
    o, lse = native.paged_decode_native(
        q, batch.k_cache, batch.v_cache, _tables(batch), _ints(batch.seq_lens), 0.25,
        _ints(starts), prefix,
    )  # fmt: skip
    assert torch.all(lse[3] == -math.inf) and torch.all(o[3] == 0)


@settings(max_examples=30, deadline=None)
@given(
    windows=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), min_size=1, max_size=6),
    prefix_len=st.integers(1, 40),
    block_size=st.sampled_from([1, 3, 16, 20]),
    heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (8, 1), (4, 1)]),
    head_dim=st.sampled_from([4, 7, 16, 64, 80, 128]),
)
def test_hypothesis_joins(
    windows: list[tuple[int, int]],
    prefix_len: int,
    block_size: int,
    heads: tuple[int, int],
    head_dim: int,
) -> None:
    """Windows cut at a prefix (some empty), any head grouping and head size, 0-3 prefix
    states per request drawn from a shared pool (some empty): the joined result equals the
    window merged with its states one by one."""
    num_q_heads, num_kv_heads = heads
    tails = [t for t, _ in windows]
    batch = make_batch(
        [("p",)] * len(tails),
        {"p": prefix_len},
        tails,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    num_states = 4
    rows_of = [[(b + j) % num_states for j in range(n)] for b, (_, n) in enumerate(windows)]
    prefix = _states(rows_of, num_states, num_q_heads, head_dim, seed=len(windows))
    q = torch.randn(len(tails), num_q_heads, head_dim, generator=torch.Generator().manual_seed(3))
    _assert_join(batch, q, head_dim**-0.5, [prefix_len] * len(tails), prefix)


def test_bad_prefix_states_are_named() -> None:
    batch = make_batch([("p",)] * 2, {"p": 8}, [3, 2], block_size=4, num_kv_heads=2, head_dim=16)
    q = torch.randn(2, 4, 16)
    args = (q, batch.k_cache, batch.v_cache, _tables(batch), _ints(batch.seq_lens), 1.0, None)
    good = _states([[0], [1]], 2, 4, 16, seed=0)
    cases = {
        "outside": native.PrefixStates(good.o, good.lse, good.request_offsets, _ints([0, 2])),
        "must not decrease": native.PrefixStates(good.o, good.lse, _ints([0, 2, 1]), _ints([0])),
        "from 0 to": native.PrefixStates(good.o, good.lse, _ints([0, 1, 1]), _ints([0, 1])),
        "int32": native.PrefixStates(
            good.o, good.lse, good.request_offsets, good.request_rows.long()
        ),
        "want prefix o": native.PrefixStates(
            good.o[:, :, :8].contiguous(), good.lse, good.request_offsets, good.request_rows
        ),
        "fp32": native.PrefixStates(
            good.o.double(), good.lse, good.request_offsets, good.request_rows
        ),
    }
    for message, prefix in cases.items():
        with pytest.raises(ValueError, match=message):
            native.paged_decode_native(*args, prefix)
