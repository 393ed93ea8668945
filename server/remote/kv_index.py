"""What one engine's prefix cache holds, read from the engine's own KV events.

The engine names its blocks by its own hashes (vLLM: sha256 over the parent hash, the
block's tokens and extra keys; the built-in engine: Python's tuple hash), which the front
need not reproduce: a ``BlockStored`` event carries each block's token ids and its parent's
hash, so the index chains a key of its own over the same content (the parent's key and the
block's tokens; a prompt's first block keyed by its extra keys, which hold the request's
``cache_salt``, i.e. the tenant) and keeps a map from the engine's hash to that key. A
prompt then matches as many leading blocks as the index holds keys for, computed from the
prompt's ids in the engine's block size (learned from the events). This is how llm-d's
precise prefix scorer and Dynamo's KV router read the same events.

A block whose parent the index never saw (published before the subscriber joined, or lost
in a gap) cannot be placed in a chain and is skipped: the index may under-estimate what an
engine holds, and only over-estimates when removals were lost (the subscriber clears it
then). vLLM re-announces a prefix's blocks when a request hits them, so a skipped chain
comes back the next time it is used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from eclectus.protocol.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
)


def root_key(extra: tuple[object, ...] | None) -> int:
    """The parent key of a prompt's first block, given its extra keys (pure)."""
    return hash(("eclectus-kv-root", extra))


def salt_keys(tenant: str | None) -> tuple[object, ...] | None:
    """A first block's extra keys for a request of ``tenant`` (pure): its ``cache_salt``,
    which the remote backend sets to the tenant, as vLLM publishes it."""
    return None if tenant is None else (tenant,)


def chain_keys(token_ids: Sequence[int], block_size: int, tenant: str | None) -> list[int]:
    """The index keys of the prompt's full blocks, first block first (pure)."""
    keys: list[int] = []
    parent = root_key(salt_keys(tenant))
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return keys


class BlockIndex:
    """The blocks one engine holds, as index keys. Mutating methods say so."""

    def __init__(self) -> None:
        self.block_size: int | None = None  # the engine's, from its first BlockStored
        self._key_of: dict[ExternalBlockHash, int] = {}  # engine hash -> index key
        self._held: Counter[int] = Counter()  # index key -> engine blocks holding it
        self.num_skipped = 0  # stored blocks not indexed (unknown parent, other tier)

    def __len__(self) -> int:
        return len(self._key_of)

    def match(self, keys: Sequence[int]) -> int:
        """Tokens of the longest run of leading ``keys`` held (pure)."""
        if self.block_size is None:
            return 0
        num = 0
        for key in keys:
            if key not in self._held:
                break
            num += 1
        return num * self.block_size

    def apply(self, event: KVCacheEvent) -> None:
        """Fold one event in (mutates)."""
        if isinstance(event, BlockStored):
            self._store(event)
        elif isinstance(event, BlockRemoved):
            if _ours(event.medium, event.group_idx):
                for block_hash in event.block_hashes:
                    self._remove(block_hash)
        elif isinstance(event, AllBlocksCleared):
            self.clear()

    def clear(self) -> None:
        """Forget every block (mutates): the engine's cache was reset or events were lost."""
        self._key_of.clear()
        self._held.clear()

    def _store(self, event: BlockStored) -> None:
        num = len(event.block_hashes)
        if self.block_size is None:
            self.block_size = event.block_size
        if (
            not _ours(event.medium, event.group_idx)
            or event.block_size != self.block_size
            or len(event.token_ids) != num * event.block_size
        ):
            self.num_skipped += num
            return
        if event.parent_block_hash is None:
            extra = event.extra_keys[0] if event.extra_keys else None
            parent: int | None = root_key(tuple(extra) if extra else None)
        else:
            parent = self._key_of.get(event.parent_block_hash)
        if parent is None:  # the parent's own event was never seen
            self.num_skipped += num
            return
        size = event.block_size
        for i, block_hash in enumerate(event.block_hashes):
            parent = hash((parent, tuple(event.token_ids[i * size : (i + 1) * size])))
            if block_hash not in self._key_of:  # vLLM re-announces blocks a request hit
                self._key_of[block_hash] = parent
                self._held[parent] += 1

    def _remove(self, block_hash: ExternalBlockHash) -> None:
        key = self._key_of.pop(block_hash, None)
        if key is None:
            return
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]


def _ours(medium: str | None, group_idx: int | None) -> bool:
    """Whether an event is about the engine's own KV pool (pure): offloading tiers publish
    other media, and a hybrid model's other KV groups other indices."""
    return medium in (None, MEDIUM_GPU) and group_idx in (None, 0)
