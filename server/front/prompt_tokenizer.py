"""Prompts tokenized off the event loop, in the order they come.

The event loop parses every request, renders every stream and hands work to the engine; a
burst of long prompts tokenized on it (a 2,000-token prompt takes ~1.5 ms of CPU) holds all
of that up, and the engine's step thread, which needs the GIL between its torch calls, with
it. vLLM tokenizes in its API-server process, on a one-thread executor
(``AsyncMicrobatchTokenizer``); this is the same idea inside one process: one worker thread,
and a tokenizer that releases the GIL while it encodes (``Tokenizer.encode_pieces``), so the
loop keeps serving and the step thread keeps stepping while a burst is tokenized.

A short prompt, when nothing is queued ahead of it, is tokenized inline: the hop to the
worker and back costs more than encoding a few hundred characters. Anything that arrives
while the worker has work goes behind it, so prompts reach the engine in the order they
were handed here (one worker: its futures complete in submission order).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from eclectus.server.front.prompt import Front, Prompt

# Prompts of at most this many characters are tokenized inline when the worker is idle:
# ~50 us of encoding, about what a thread hop costs.
INLINE_MAX_CHARS = 1024


class PromptTokenizer:
    """Tokenizes prompts for the scheduler (mutating methods say so). ``close`` ends the
    worker thread; the worker starts on the first prompt it is given."""

    def __init__(self, front: Front, inline_max_chars: int = INLINE_MAX_CHARS) -> None:
        self.front = front
        self.inline_max_chars = inline_max_chars
        self.num_offloaded = 0  # prompts tokenized on the worker (tests and gauges read it)
        self._num_pending = 0  # handed to the worker, not yet back
        self._pool: ThreadPoolExecutor | None = None

    @property
    def num_pending(self) -> int:
        """Prompts handed to the worker and not yet back (pure): requests that arrived but
        are not in the scheduler yet (a draining server waits for them)."""
        return self._num_pending

    async def tokenize_prompt(
        self, segments: Sequence[str], add_special_tokens: bool = True
    ) -> Prompt:
        """``front.encode(segments, add_special_tokens)`` inline when the prompt is short and
        nothing is pending, else behind the pending prompts on the worker (mutates the
        counts; starts the worker once)."""
        if self._num_pending == 0 and sum(map(len, segments)) <= self.inline_max_chars:
            return self.front.encode(segments, add_special_tokens)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="eclectus-tokenize")
        self._num_pending += 1
        self.num_offloaded += 1
        try:
            loop = asyncio.get_running_loop()
            encode = self.front.encode
            return await loop.run_in_executor(self._pool, encode, segments, add_special_tokens)
        finally:
            self._num_pending -= 1

    def close(self) -> None:
        """Let the worker end once the prompts queued on it are done, a few ms each, without
        waiting for it (mutates; idempotent): their requests then learn that the server is
        closing and answer so."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
