"""Blocks, their chained hashes, the LRU free queue and the hash -> block map.

A full block's hash chains its parent's hash and its own token ids, so equal hashes mean equal
whole prefixes (up to a 64-bit collision, which :meth:`PrefixCache.lookup` rules out by
comparing the parent hash and the tokens exactly). Only full blocks are hashed: a partial
block's KV is still growing. The first block's parent is a root hash salted with the tenant, so
tenants never share KV.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

BlockHash = NewType("BlockHash", int)


def root_hash(tenant: str | None) -> BlockHash:
    """The parent hash of a sequence's first block; differs per tenant (pure)."""
    return BlockHash(hash(("eclectus-root", tenant)))


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Hash of a full block given its parent's hash and its token ids (pure).

    Python's hash of a tuple of ints is deterministic across runs (only str hashing is
    salted, and the tenant string enters once, in :func:`root_hash`).
    """
    return BlockHash(hash((parent, tuple(token_ids))))


@dataclass(slots=True)
class KVBlock:
    """One physical KV block: ``block_size`` token slots in every layer's cache."""

    block_id: int
    ref_count: int = 0
    # Set once, when the block is full and cached; cleared when it is evicted.
    block_hash: BlockHash | None = None
    parent_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()

    def set_hash(
        self, block_hash: BlockHash, parent: BlockHash, token_ids: tuple[int, ...]
    ) -> None:
        """Mark the block as holding this exact prefix block (mutates; refuses to overwrite)."""
        if self.block_hash is not None:
            raise RuntimeError(f"block {self.block_id} already has a hash")
        self.block_hash, self.parent_hash, self.token_ids = block_hash, parent, token_ids

    def clear_hash(self) -> None:
        """Forget the cached content (mutates)."""
        self.block_hash, self.parent_hash, self.token_ids = None, None, ()


class FreeBlockQueue:
    """Unreferenced blocks in eviction order: the head is evicted first.

    An OrderedDict gives what vLLM's doubly linked list gives: O(1) removal from the middle
    when a prefix-cache hit revives a free block, O(1) pop at the head, and LRU order kept.
    Blocks without cached content go to the head (nothing is lost by reusing them first).
    """

    def __init__(self, block_ids: Sequence[int]) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._queue

    def pop_lru(self) -> int:
        """Remove and return the block to reuse next (mutates). Raises if empty."""
        return self._queue.popitem(last=False)[0]

    def remove(self, block_id: int) -> None:
        """Take a block out of the queue, wherever it is (mutates)."""
        del self._queue[block_id]

    def push(self, block_id: int, *, cached: bool) -> None:
        """Add a freed block: cached ones at the tail (most recent), others at the head."""
        self._queue[block_id] = None
        if not cached:
            self._queue.move_to_end(block_id, last=False)


class PrefixCache:
    """The map from block hash to the physical block holding that prefix block."""

    def __init__(self) -> None:
        self._hash_to_block: dict[BlockHash, KVBlock] = {}

    def __len__(self) -> int:
        return len(self._hash_to_block)

    def lookup(
        self, block_hash: BlockHash, parent: BlockHash, token_ids: Sequence[int]
    ) -> KVBlock | None:
        """The block holding exactly this block of this prefix, or None (pure)."""
        block = self._hash_to_block.get(block_hash)
        if block is None or block.parent_hash != parent or block.token_ids != tuple(token_ids):
            return None
        return block

    def insert(
        self, block: KVBlock, block_hash: BlockHash, parent: BlockHash, token_ids: tuple[int, ...]
    ) -> bool:
        """Cache ``block`` under ``block_hash`` (mutates). Returns False, caching nothing,
        when another block already holds that hash (the first copy stays canonical)."""
        if block_hash in self._hash_to_block:
            return False
        block.set_hash(block_hash, parent, token_ids)
        self._hash_to_block[block_hash] = block
        return True

    def evict(self, block: KVBlock) -> None:
        """Drop ``block``'s content from the cache, if cached (mutates)."""
        if block.block_hash is not None:
            if self._hash_to_block.get(block.block_hash) is block:
                del self._hash_to_block[block.block_hash]
            block.clear_hash()
