"""Background work beside latency work on a remote engine: a cap, and preemption by
continuation.

Why. vLLM's ``--scheduling-policy priority`` orders only its *waiting* queue; requests it has
admitted keep running whatever their priority (it preempts only when KV blocks run out). A
chat that reaches an engine running eight background calls therefore decodes in a batch of
nine, and every step of that batch costs it. The built-in engine ranks running requests too
(``EngineConfig.max_background_seqs``); a remote engine needs the pool to do it.

The rule, per engine, while at least one foreground (latency or deadline) attempt is in
flight on it:

1. **cap**: no new background attempt starts there once ``max_background`` are running;
2. **preempt**: the background attempts beyond ``max_background`` are paused: their streams
   are closed (which aborts them in vLLM and SGLang) and, once the engine admits background
   again, they continue with the prompt followed by the ids generated so far and
   ``max_tokens`` minus their count (backend.py, the same continuation as a failover). The
   engine's prefix cache holds most of that prefix, so the re-prefill is cheap; under greedy
   decoding the text equals an uninterrupted run's.

Who keeps running: the attempts with the best rank (the smallest priority), then the oldest
(most of their work done). A constrained attempt (structured outputs) is never preempted: its
grammar would start over mid-structure on the next attempt. With no foreground in flight,
background runs uncapped. A paused attempt stops at once, even mid-prefill or between two
pieces (:func:`until_paused`): the engine's step in progress is the last it spends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BackgroundAttempt:
    """A background attempt running on one engine, as the policy sees it."""

    request_id: str
    priority: float  # the scheduler's rank (smaller runs first)
    seq: int  # placement order on the pool (smaller started earlier)
    preemptible: bool = True  # False: a constrained attempt, which cannot be continued


def admits_background(num_foreground: int, num_background: int, max_background: int | None) -> bool:
    """Whether an engine may start one more background attempt (pure)."""
    return max_background is None or num_foreground == 0 or num_background < max_background


def to_preempt(
    num_foreground: int, running: list[BackgroundAttempt], max_background: int | None
) -> list[str]:
    """The request ids of the background attempts to pause on an engine (pure): none while
    no foreground runs there; else all but the ``max_background`` best (smallest priority,
    then oldest), preemptible ones only. Unpreemptible attempts are kept first: they count
    against the cap and cannot be paused."""
    if max_background is None or num_foreground == 0 or len(running) <= max_background:
        return []
    ranked = sorted(running, key=lambda a: (a.preemptible, a.priority, a.seq))
    return [a.request_id for a in ranked[max_background:] if a.preemptible]


async def until_paused(stream: AsyncIterator[T], pause: asyncio.Event) -> AsyncIterator[T]:
    """``stream``'s items until ``pause`` is set, then stop at once: the wait for the next
    item is cancelled (which ends ``stream``; closing it aborts the engine's request). An
    item that arrived together with the pause is still yielded."""
    waiter = asyncio.ensure_future(pause.wait())
    try:
        while True:
            item = asyncio.ensure_future(anext(stream))
            await asyncio.wait({item, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not item.done():
                item.cancel()
                await asyncio.wait({item})
                return
            try:
                yield item.result()
            except StopAsyncIteration:
                return
    finally:
        waiter.cancel()
