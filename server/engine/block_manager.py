"""Paged KV bookkeeping: a fixed pool of blocks, per-sequence block tables, ref counts,
prefix-cache hits, and pins.

Life of a block: free (ref 0, in the LRU free queue, maybe still cached) -> referenced by one or
more block tables or pins -> free again when the last reference drops. A cached free block
keeps its hash until it is reused for other tokens (LRU eviction), so a later request with the
same prefix revives it. Nothing here touches tensors. A block, once hashed, is never written
again, so sharing needs no copy-on-write: requests share full blocks only.

With ``enable_kv_events`` the manager records what the prefix cache gains and loses as vLLM's
KV events (protocol/kv_events.py): ``BlockStored`` for the blocks an allocation caches (and, as
vLLM does, for the cached blocks a new request hits, so a subscriber that lost track learns
them again), ``BlockRemoved`` for each evicted block; the engine publishes them per step
(:meth:`take_events`).
"""

from __future__ import annotations

from eclectus.protocol.kv_events import MEDIUM_GPU, BlockRemoved, BlockStored, KVCacheEvent
from eclectus.server.engine.prefix_cache import (
    BlockHash,
    FreeBlockQueue,
    KVBlock,
    PrefixCache,
    hash_block_tokens,
    root_hash,
)
from eclectus.server.engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Owns the pool of ``num_blocks`` blocks of ``block_size`` tokens.

    Methods that mutate say so.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        enable_kv_events: bool = False,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks, block_size >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(range(num_blocks))
        self.cache = PrefixCache()
        self.pins: dict[str, list[int]] = {}  # request id -> pinned block ids
        # the cache's changes since the last take_events; None: not recorded
        self.kv_events: list[KVCacheEvent] | None = [] if enable_kv_events else None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation may take (unreferenced, cached or not)."""
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cache)

    # ---- prefix cache -------------------------------------------------------------------

    def _hash_blocks(self, seq: Sequence, num_full_blocks: int) -> None:
        """Extend ``seq.block_hashes`` to its first ``num_full_blocks`` blocks (mutates seq)."""
        bs, hashes = self.block_size, seq.block_hashes
        parent = hashes[-1] if hashes else root_hash(seq.tenant)
        for i in range(len(hashes), num_full_blocks):
            parent = hash_block_tokens(parent, seq.token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)

    def _parent_hash(self, seq: Sequence, index: int) -> BlockHash:
        return seq.block_hashes[index - 1] if index else root_hash(seq.tenant)

    def find_cached_blocks(self, seq: Sequence) -> list[KVBlock]:
        """The longest run of cached blocks matching the start of ``seq.token_ids``.

        At least one token is always left to compute (its logits give the next token), so a
        fully cached block-aligned prompt hits one block less. Touches no ref count; only
        fills ``seq.block_hashes`` (a cache of pure values).
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._hash_blocks(seq, max_blocks)
        bs, hits = self.block_size, []
        for i in range(max_blocks):
            block = self.cache.lookup(
                seq.block_hashes[i], self._parent_hash(seq, i), seq.token_ids[i * bs : (i + 1) * bs]
            )
            if block is None:
                break
            hits.append(block)
        return hits

    # ---- allocation -----------------------------------------------------------------------

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, cached_blocks: list[KVBlock] | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``seq``, after its computed tokens
        and the ``cached_blocks`` hits (only for a sequence holding no blocks yet).

        On success (True) mutates: appends to ``seq.block_table``, takes references, copies a
        shared partial last block on write (queued in ``pending_copies``), and caches the
        hashes of blocks these tokens fill. On failure (False) changes nothing.
        """
        hits = cached_blocks or []
        assert not hits or not seq.block_table, "hits apply to a fresh sequence only"
        table, bs = seq.block_table, self.block_size
        start = seq.num_computed_tokens + len(hits) * bs  # first token written this step
        end = start + num_new_tokens
        num_new_blocks = max(0, cdiv(end, bs) - len(table) - len(hits))
        revived = sum(1 for b in hits if b.ref_count == 0)  # hits leaving the free queue
        if num_new_blocks + revived > len(self.free_queue):
            return False
        for block in hits:
            self._take(block)
            table.append(block.block_id)
        if hits and self.kv_events is not None:
            self._record_stored(seq, 0, len(hits))
        for _ in range(num_new_blocks):
            table.append(self._pop_free().block_id)
        self._cache_full_blocks(seq, start, end)
        return True

    def _take(self, block: KVBlock) -> None:
        if block.ref_count == 0:
            self.free_queue.remove(block.block_id)
        block.ref_count += 1

    def _pop_free(self) -> KVBlock:
        block = self.blocks[self.free_queue.pop_lru()]
        self._evict(block)  # LRU eviction: its old content is gone now
        block.ref_count = 1
        return block

    def _cache_full_blocks(self, seq: Sequence, start: int, end: int) -> None:
        """Cache the blocks that tokens [start, end) complete. Caching at allocation is safe:
        every layer stores the step's K/V before any attention reads it, so a request
        admitted later in the same step may already hit these blocks."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        self._hash_blocks(seq, end // bs)
        run = start // bs  # the first block of the run of newly cached ones (events)
        for i in range(start // bs, end // bs):
            block = self.blocks[seq.block_table[i]]
            stored = block.block_hash is None and self.cache.insert(
                block,
                seq.block_hashes[i],
                self._parent_hash(seq, i),
                tuple(seq.token_ids[i * bs : (i + 1) * bs]),
            )
            if not stored and self.kv_events is not None:
                self._record_stored(seq, run, i)
                run = i + 1
        if self.kv_events is not None:
            self._record_stored(seq, run, end // bs)

    # ---- KV events ------------------------------------------------------------------------

    def _record_stored(self, seq: Sequence, first: int, end: int) -> None:
        """Record blocks ``first..end-1`` of ``seq`` as one BlockStored (mutates the
        event list): the parent of a prompt's first block is None and its tenant is its
        extra key (vLLM's ``cache_salt``)."""
        assert self.kv_events is not None
        if end <= first:
            return
        bs = self.block_size
        extra: list[tuple[object, ...] | None] = [None] * (end - first)
        if first == 0 and seq.tenant is not None:
            extra[0] = (seq.tenant,)
        self.kv_events.append(
            BlockStored(
                block_hashes=list(seq.block_hashes[first:end]),
                parent_block_hash=seq.block_hashes[first - 1] if first else None,
                token_ids=list(seq.token_ids[first * bs : end * bs]),
                block_size=bs,
                lora_id=None,
                medium=MEDIUM_GPU,
                lora_name=None,
                extra_keys=extra if any(extra) else None,
            )
        )

    def _evict(self, block: KVBlock) -> None:
        """Drop ``block``'s cached content, recording its removal (mutates)."""
        if block.block_hash is not None and self.kv_events is not None:
            self.kv_events.append(BlockRemoved(block_hashes=[block.block_hash], medium=MEDIUM_GPU))
        self.cache.evict(block)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block nobody holds (mutates): the next request computes its
        whole prompt, as on a cold engine. Blocks a running request or a pin holds stay
        cached, as their KV is live. Returns the number of blocks forgotten."""
        idle = [b for b in self.blocks if b.block_hash is not None and b.ref_count == 0]
        for block in idle:
            self._evict(block)
            self.free_queue.remove(block.block_id)  # uncached now: reused first
            self.free_queue.push(block.block_id, cached=False)
        return len(idle)

    def take_events(self) -> list[KVCacheEvent]:
        """The events recorded since the last call (mutates: empties the list)."""
        if not self.kv_events:
            return []
        events, self.kv_events = self.kv_events, []
        return events

    # ---- release --------------------------------------------------------------------------

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue.push(block_id, cached=block.block_hash is not None)

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references (mutates seq and the pool). Tail blocks are released
        first, so they sit nearer the eviction end than the prefix they extend."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table.clear()

    def forget(self, seq: Sequence) -> None:
        """Uncache every block of ``seq`` (mutates): after a failed step their KV may be
        garbage, so nobody may hit them again."""
        for block_id in seq.block_table:
            self._evict(self.blocks[block_id])

    # ---- pins -----------------------------------------------------------------------------

    def pin(self, request_id: str, seq: Sequence, num_tokens: int) -> int:
        """Keep the full blocks of ``seq``'s first ``num_tokens`` referenced until
        :meth:`unpin` (mutates). Returns the number of blocks pinned; pins once per id."""
        if request_id in self.pins:
            return 0
        block_ids = seq.block_table[: num_tokens // self.block_size]
        for block_id in block_ids:
            self.blocks[block_id].ref_count += 1
        self.pins[request_id] = list(block_ids)
        return len(block_ids)

    def unpin(self, request_id: str) -> None:
        """Release the pin of ``request_id`` (mutates; no-op when none)."""
        for block_id in self.pins.pop(request_id, []):
            self._release(block_id)

    # ---- checks ---------------------------------------------------------------------------

    def check_invariants(self, live: list[Sequence]) -> None:
        """Assert that ref counts equal the references held by ``live`` sequences and pins,
        that free means unreferenced, and that the cache map is consistent (pure)."""
        refs = [0] * self.num_blocks
        for seq in live:
            for block_id in seq.block_table:
                refs[block_id] += 1
        for block_ids in self.pins.values():
            for block_id in block_ids:
                refs[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (block, refs[block.block_id])
            assert (block.ref_count == 0) == (block.block_id in self.free_queue), block
            if block.block_hash is not None:
                assert (
                    self.cache.lookup(
                        block.block_hash,
                        block.parent_hash,  # type: ignore[arg-type]
                        block.token_ids,
                    )
                    is block
                )
