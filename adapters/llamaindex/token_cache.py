"""A bounded LRU cache of the server tokenizer's answers, so ``Settings.tokenizer`` costs
one round trip per distinct text instead of one per call.

LlamaIndex counts tokens one string at a time, and counts the same strings again and again:
``TokenTextSplitter`` (PromptHelper's repack before every tree-summarize or compact call)
splits a text that is over its chunk size at every space and counts each word, so the words
of a document are counted thousands of times; a query re-counts the chunks the index build
counted. Without a cache each count is a ``tokenize`` frame and a round trip.

Exact by construction: the server's ``tokenize`` is a pure function of the model and the
text, so a cached answer is the answer the server would give. The cache belongs to one SDK
session and model: it empties when the LLM reconnects (the server behind the URL may have
changed) or its ``model`` changes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable


class TokenCache:
    """text -> token ids, least recently used out first, bounded by ``max_tokens`` ids held
    in all. Thread-safe (LlamaIndex counts from worker threads too); the tokenize round trip
    runs outside the lock. ``max_tokens`` 0 turns caching off."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._owner: object | None = None
        self._entries: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._num_tokens = 0

    def ids(self, owner: object, text: str, tokenize: Callable[[str], list[int]]) -> list[int]:
        """The ids of ``text``: cached, else ``tokenize(text)`` (then cached when it fits).
        ``owner`` says where the ids come from (the session and the model): an owner not
        equal to the last one empties the cache first. Mutates the cache; returns a fresh
        list the caller may modify."""
        with self._lock:
            if owner != self._owner:
                self._entries.clear()
                self._num_tokens = 0
                self._owner = owner
            cached = self._entries.get(text)
            if cached is not None:
                self._entries.move_to_end(text)
                return list(cached)
        ids = tokenize(text)
        self._store(owner, text, tuple(ids))
        return list(ids)

    def __len__(self) -> int:
        """How many texts are cached (pure)."""
        return len(self._entries)

    def _store(self, owner: object, text: str, ids: tuple[int, ...]) -> None:
        # one entry costs its ids plus one, so that empty texts count too
        cost = len(ids) + 1
        with self._lock:
            if owner != self._owner or cost > self.max_tokens or text in self._entries:
                return
            self._entries[text] = ids
            self._num_tokens += cost
            while self._num_tokens > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self._num_tokens -= len(evicted) + 1
