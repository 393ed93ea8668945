"""Block manager and prefix cache: hits, eviction, copy-on-write, pins, and no leaks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.protocol.kv_events import BlockRemoved
from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.block_manager import BlockManager
from eclectus.server.engine.prefix_cache import FreeBlockQueue
from eclectus.server.engine.sequence import Sequence

BS = 4


def make_seq(tokens: list[int], arrival: int = 0, tenant: str | None = None) -> Sequence:
    return Sequence(f"r{arrival}", list(tokens), SamplingParams(), arrival, tenant=tenant)


def admit(bm: BlockManager, seq: Sequence) -> int:
    """Admit like the scheduler does: hits, then room for the rest. Returns hit tokens."""
    hits = bm.find_cached_blocks(seq)
    assert bm.allocate_slots(seq, seq.num_tokens - len(hits) * BS, hits)
    seq.num_computed_tokens = seq.num_tokens
    return len(hits) * BS


def test_free_queue_is_lru_and_removes_from_the_middle() -> None:
    queue = FreeBlockQueue([0, 1, 2])
    queue.remove(1)
    queue.push(1, cached=True)  # most recently used: evicted last
    queue.push(5, cached=False)  # worthless: evicted first
    assert [queue.pop_lru() for _ in range(4)] == [5, 0, 2, 1]


def test_shared_prefix_hits_same_physical_blocks() -> None:
    bm = BlockManager(16, BS)
    a = make_seq(list(range(10)), 0)
    assert admit(bm, a) == 0
    b = make_seq([*range(8), 99, 98, 97], 1)
    assert admit(bm, b) == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.check_invariants([a, b])


def test_hit_leaves_one_token_to_compute() -> None:
    bm = BlockManager(16, BS)
    admit(bm, make_seq(list(range(8)), 0))
    assert admit(bm, make_seq(list(range(8)), 1)) == 4  # last block recomputed for logits


def test_freed_blocks_stay_cached_until_evicted() -> None:
    bm = BlockManager(4, BS)
    a = make_seq(list(range(8)), 0)
    admit(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    assert admit(bm, make_seq(list(range(9)), 1)) == 8  # revived from the free queue
    c = make_seq([50 + i for i in range(12)], 2)  # needs 3 blocks: only 1 is free
    assert not bm.allocate_slots(c, 12)
    assert c.block_table == []


def test_eviction_reuses_lru_blocks_and_drops_their_hashes() -> None:
    bm = BlockManager(2, BS)
    a = make_seq(list(range(8)), 0)
    admit(bm, a)
    bm.free(a)
    b = make_seq([7] * 8, 1)
    assert admit(bm, b) == 0
    assert bm.num_cached_blocks == 2  # b's blocks replaced a's
    assert bm.find_cached_blocks(make_seq(list(range(9)), 2)) == []


def test_tenant_salt_separates_caches() -> None:
    bm = BlockManager(16, BS)
    admit(bm, make_seq(list(range(9)), 0, tenant="a"))
    assert admit(bm, make_seq(list(range(9)), 1, tenant="b")) == 0
    assert admit(bm, make_seq(list(range(9)), 2, tenant="a")) == 8


def test_pin_keeps_blocks_until_unpin() -> None:
    bm = BlockManager(4, BS)
    a = make_seq(list(range(10)), 0)
    admit(bm, a)
    assert bm.pin("a", a, 9) == 2
    bm.free(a)
    assert bm.num_free_blocks == 2
    bm.check_invariants([])
    bm.unpin("a")
    bm.unpin("a")  # idempotent
    assert bm.num_free_blocks == 4
    bm.check_invariants([])


ops = st.lists(
    st.tuples(st.sampled_from(["add", "grow", "free", "pin", "unpin"]), st.integers(0, 1000)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_random_workloads_leak_nothing(script: list[tuple[str, int]]) -> None:
    bm = BlockManager(12, BS)
    live: list[Sequence] = []
    for step, (op, x) in enumerate(script):
        if op == "add":  # prompts drawn from few prefixes so they share
            tokens = [x % 3] * (4 * (x % 3)) + list(range(x % 7))
            seq = make_seq([*tokens, 1], step)
            hits = bm.find_cached_blocks(seq)
            if bm.allocate_slots(seq, seq.num_tokens - len(hits) * BS, hits):
                seq.num_computed_tokens = seq.num_tokens
                live.append(seq)
        elif op == "grow" and live:
            seq = live[x % len(live)]
            seq.token_ids.append(x % 5)
            if bm.allocate_slots(seq, 1):
                seq.num_computed_tokens += 1
            else:
                seq.token_ids.pop()
        elif op == "free" and live:
            bm.free(live.pop(x % len(live)))
        elif op == "pin" and live:
            bm.pin(f"p{x % 3}", live[x % len(live)], x % 16)
        elif op == "unpin":
            bm.unpin(f"p{x % 3}")
        bm.check_invariants(live)
    for seq in live:
        bm.free(seq)
    for request_id in list(bm.pins):
        bm.unpin(request_id)
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks  # every block free (cached or not)


def test_a_cache_reset_forgets_idle_blocks_and_keeps_held_ones() -> None:
    """What ``POST /reset_prefix_cache`` does: a freed prefix is forgotten (the next request
    computes it all, and the free queue reuses those blocks first), a running request's and
    a pin's blocks stay cached, and the removals are published as KV events."""
    bm = BlockManager(16, BS, enable_kv_events=True)
    idle = make_seq(list(range(12)), 0)
    admit(bm, idle)
    idle_hashes = {bm.blocks[i].block_hash for i in idle.block_table}
    bm.free(idle)
    held = make_seq([50 + i for i in range(9)], 1)
    admit(bm, held)
    pinned = make_seq([80 + i for i in range(8)], 2)
    admit(bm, pinned)
    assert bm.pin("p", pinned, 8) == 2
    bm.free(pinned)
    bm.take_events()
    assert bm.num_cached_blocks == 3 + 2 + 2
    assert bm.reset_prefix_cache() == 3
    events = bm.take_events()
    assert all(isinstance(e, BlockRemoved) for e in events)
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert None not in idle_hashes and sorted(removed) == sorted(idle_hashes)
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 16 - 3 - 2
    assert admit(bm, make_seq(list(range(12)), 3)) == 0  # computed again, as on a cold engine
    assert admit(bm, make_seq([50 + i for i in range(9)], 4)) == 8  # still cached
    bm.unpin("p")
    assert bm.reset_prefix_cache() == 2 and bm.reset_prefix_cache() == 0
