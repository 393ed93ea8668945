"""The background policy beside latency work (preemption.py): examples, and invariants that
hold for any engine state (hypothesis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from eclectus.server.remote.preemption import (
    BackgroundAttempt,
    admits_background,
    to_preempt,
    until_paused,
)


def _attempt(i: int, priority: float = 10.0, preemptible: bool = True) -> BackgroundAttempt:
    return BackgroundAttempt(f"r{i}", priority, i, preemptible)


def test_no_foreground_means_no_cap() -> None:
    """With no latency work on the engine, background runs and starts without a cap."""
    running = [_attempt(i) for i in range(8)]
    assert to_preempt(0, running, 1) == []
    assert admits_background(0, 8, 1)


def test_foreground_keeps_the_best_ranked_then_oldest() -> None:
    """The smallest priority stays, then the oldest; the rest are paused."""
    running = [_attempt(0, 20.0), _attempt(1, 5.0), _attempt(2, 20.0), _attempt(3, 20.0)]
    assert to_preempt(1, running, 2) == ["r2", "r3"]
    assert not admits_background(1, 2, 2)
    assert admits_background(1, 1, 2)


def test_constrained_attempts_are_kept_and_count() -> None:
    """An unpreemptible (constrained) attempt is never paused and takes a slot of the cap."""
    running = [_attempt(0, 1.0), _attempt(1, 50.0, preemptible=False), _attempt(2, 2.0)]
    assert to_preempt(1, running, 1) == ["r0", "r2"]
    assert to_preempt(1, running, 0) == ["r0", "r2"]


def test_none_is_no_cap_and_zero_pauses_all() -> None:
    running = [_attempt(i) for i in range(3)]
    assert to_preempt(2, running, None) == [] and admits_background(2, 3, None)
    assert to_preempt(1, running, 0) == ["r0", "r1", "r2"] and not admits_background(1, 0, 0)


attempts = st.lists(
    st.builds(
        BackgroundAttempt,
        request_id=st.uuids().map(str),
        priority=st.floats(0, 1e6),
        seq=st.integers(0, 10**6),
        preemptible=st.booleans(),
    ),
    max_size=12,
    unique_by=lambda a: a.request_id,
)


@given(attempts, st.integers(0, 4), st.integers(0, 6))
def test_after_pausing_at_most_the_cap_runs(
    running: list[BackgroundAttempt], num_foreground: int, cap: int
) -> None:
    """Paused ids are running, preemptible ones; what is left is within the cap unless only
    unpreemptible attempts exceed it; and a paused attempt never outranks a kept
    preemptible one."""
    paused = set(to_preempt(num_foreground, running, cap))
    by_id = {a.request_id: a for a in running}
    assert paused <= set(by_id)
    assert all(by_id[p].preemptible for p in paused)
    kept = [a for a in running if a.request_id not in paused]
    if num_foreground == 0:
        assert not paused
        return
    assert len(kept) <= max(cap, sum(not a.preemptible for a in running))
    for p in paused:
        for k in kept:
            if k.preemptible:
                assert (k.priority, k.seq) <= (by_id[p].priority, by_id[p].seq)


async def test_until_paused_stops_mid_wait_and_ends_the_stream() -> None:
    """A pause set while the next item is awaited stops the iteration at once (not at the
    next item) and ends the stream (its cleanup runs: the engine's request is aborted)."""
    closed = asyncio.Event()

    async def slow() -> AsyncIterator[int]:
        try:
            yield 1
            await asyncio.sleep(60)  # a prefill, or a long step
            yield 2
        finally:
            closed.set()

    pause = asyncio.Event()
    got = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    async for item in until_paused(slow(), pause):
        got.append(item)
        loop.call_later(0.05, pause.set)
    assert got == [1] and closed.is_set()
    assert loop.time() - started < 5


async def test_until_paused_passes_everything_when_not_paused() -> None:
    async def numbers() -> AsyncIterator[int]:
        for i in range(5):
            yield i

    assert [i async for i in until_paused(numbers(), asyncio.Event())] == list(range(5))
