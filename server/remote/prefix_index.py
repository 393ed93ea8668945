"""Which prompt prefixes each engine has seen, at seam granularity.

sgl-router keeps a character radix tree per worker. Eclectus knows more: where each prompt's
segments meet (every constant text, every variable is its own segment), and those seams are
the points where a prefix can be shared. So a prefix is keyed by a hash of (tenant, its token
ids up to a seam: the ids lying wholly before it, ``Prompt.prefix_ends``), and the longest
match of a new prompt is the longest of its seam prefixes the engine holds. The tenant is
part of the key because a tenant's ``cache_salt`` keeps its KV apart from everyone else's.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from eclectus.server.front.prompt import Prompt


@dataclass(frozen=True, slots=True)
class PrefixKey:
    """One seam prefix of a prompt: its hash and its length in tokens."""

    key: int
    num_tokens: int


def prefix_keys(prompt: Prompt, tenant: str | None) -> tuple[PrefixKey, ...]:
    """The prompt's prefixes ending at each seam (repeated ends once), shortest first (pure).
    Python's hash of a tuple of ints does not vary between runs."""
    keys: list[PrefixKey] = []
    for end in sorted(set(prompt.prefix_ends)):
        if end > 0:
            keys.append(PrefixKey(hash((tenant, prompt.token_ids[:end])), end))
    return tuple(keys)


class PrefixIndex:
    """An LRU set of prefix keys for one engine, at most ``max_entries`` of them."""

    def __init__(self, max_entries: int = 65_536) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[int, int] = OrderedDict()  # key -> num tokens, LRU first

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, keys: tuple[PrefixKey, ...]) -> int:
        """Tokens of the longest of ``keys`` held here, 0 if none (pure)."""
        return max((k.num_tokens for k in keys if k.key in self._entries), default=0)

    def insert(self, keys: tuple[PrefixKey, ...]) -> None:
        """Record that the engine has (or is computing) these prefixes (mutates: evicts the
        least recently used beyond ``max_entries``)."""
        for k in keys:
            self._entries[k.key] = k.num_tokens
            self._entries.move_to_end(k.key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (mutates): the engine restarted or was lost."""
        self._entries.clear()
