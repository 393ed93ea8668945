"""The shared-prompt recipe's background work: the closed loop keeps its jobs running over
the chats' window, never more than its concurrency, and ends them cleanly."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from recipe_support import TEXT

from eclectus.recipes import MapReduceParams, SharedPromptParams
from eclectus.recipes.background import (
    JobRun,
    closed_loop,
    most_at_once,
    open_loop,
    throughput_details,
)
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.map_reduce import planned_calls, planned_output_tokens
from eclectus.recipes.observe import scrape
from eclectus.recipes.shared_prompt import Served, drop_cached_async_clients, serve
from eclectus.recipes.target import ModelFactory, Target

ENGINE_WORK = ("eclectus_inflight", "eclectus_engine_running", "eclectus_engine_waiting")


class Jobs:
    """Fake jobs that each take ``seconds`` (from job ``long_from`` on: an hour, so they are
    still running however late a loaded machine wakes the loop) and record how many run at
    once."""

    def __init__(self, seconds: float, long_from: int | None = None) -> None:
        self.seconds = seconds
        self.long_from = long_from
        self.live = self.peak = self.ended = 0

    async def __call__(self, index: int) -> None:
        self.live += 1
        self.peak = max(self.peak, self.live)
        try:
            long = self.long_from is not None and index >= self.long_from
            await asyncio.sleep(3600.0 if long else self.seconds)
        finally:
            self.live -= 1
            self.ended += 1


def clock_from(t0: float) -> float:
    return time.perf_counter() - t0


def test_closed_loop_keeps_its_jobs_running_then_cancels_them() -> None:
    """Three jobs at a time until stop; the ones running then are cancelled and have ended
    when the loop returns. (Jobs 9 on never end by themselves: a fixed stop time made the
    count of cancelled jobs depend on how late a loaded machine woke the loop.)"""

    async def main() -> tuple[list[JobRun], Jobs]:
        jobs, stop, t0 = Jobs(0.01, long_from=9), asyncio.Event(), time.perf_counter()
        loop = asyncio.create_task(closed_loop(jobs, 3, stop, lambda: clock_from(t0)))
        while jobs.ended < 9 or jobs.live < 3:  # then the live ones are jobs 9-11
            await asyncio.sleep(0.005)
        stop.set()
        return await loop, jobs

    runs, jobs = asyncio.run(main())
    assert jobs.peak == 3 == most_at_once(runs) and jobs.live == 0
    assert jobs.ended == len(runs) == 12 and [r.index for r in runs] == list(range(12))
    assert [r.completed for r in runs] == [True] * 9 + [False] * 3


def test_a_failed_job_fails_the_loop_and_ends_the_others() -> None:
    async def main() -> Jobs:
        jobs = Jobs(10.0)

        async def run_job(index: int) -> None:
            if index == 2:
                raise RuntimeError("engine down")
            await jobs(index)

        with pytest.raises(RuntimeError, match="engine down"):
            await closed_loop(run_job, 3, asyncio.Event(), time.perf_counter)
        return jobs

    jobs = asyncio.run(main())
    assert jobs.live == 0 and jobs.ended == 2


def test_open_loop_starts_each_job_at_its_time() -> None:
    async def main() -> list[JobRun]:
        t0 = time.perf_counter()
        return await open_loop(Jobs(0.01), [0.0, 0.05], lambda: clock_from(t0))

    runs = asyncio.run(main())
    assert runs[1].start_s >= 0.05 and all(r.completed for r in runs) and most_at_once(runs) == 1


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 5)), max_size=12))
def test_most_at_once_is_the_deepest_overlap(spans: list[tuple[int, int]]) -> None:
    """At most as many jobs at once as run at some job's start (a job ending when another
    starts does not overlap it)."""
    runs = [JobRun(k, start, start + length, True) for k, (start, length) in enumerate(spans)]
    expected = max((sum(r.start_s <= t < r.end_s for r in runs) for t, _ in spans), default=0)
    assert most_at_once(runs) == expected


def test_throughput_counts_completed_jobs_over_the_window() -> None:
    runs = [JobRun(0, 0.0, 1.0, True), JobRun(1, 0.0, 2.0, True), JobRun(2, 1.0, 4.0, False)]
    details = throughput_details(runs, 4.0, 100)
    assert details == {
        "analytics jobs done": 2,
        "analytics jobs cancelled": 1,
        "analytics output tok/s": 50.0,
        "analytics mean job s": 1.5,
    }
    bg = MapReduceParams(num_chunks=8, map_tokens=50, reduce_tokens=20)
    assert planned_output_tokens(bg, 8) == (planned_calls(bg, 8)[0] - 1) * 50 + 20


def wait_until_idle(metrics_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The server's metrics once nothing is in flight on it (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = scrape(metrics_url)
        if not any(metrics.get(name, 0) for name in ENGINE_WORK) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


def serve_once(params: SharedPromptParams, target: Target) -> Served:
    """One run of the chats and jobs in a fresh event loop, as the recipe's ``run`` does."""
    drop_cached_async_clients()  # the stock client's cache is bound to the last loop
    return asyncio.run(serve(params, ModelFactory(target), TEXT, {}))


def mixed(map_tokens: int) -> SharedPromptParams:
    """Four chats over half a second beside a closed loop of two small jobs."""
    return SharedPromptParams(
        users=2,
        requests=4,
        rate=8.0,
        system_tokens=128,
        answer_tokens=4,
        background=MapReduceParams(
            chunk_tokens=64, num_chunks=2, map_tokens=map_tokens, reduce_tokens=4, width=2
        ),
        background_concurrency=2,
    )


@pytest.mark.parametrize("backend", ["eclectus", "openai"])
def test_closed_loop_jobs_overlap_the_chats(embedded: Embedded, backend: str) -> None:
    """On the tiny engine, compiled and stock: two jobs at a time from the first chat to the
    last answer, never more, a new one as soon as one ends."""
    target = embedded.target(backend)  # type: ignore[arg-type]
    served = serve_once(mixed(4), target)
    runs = served.jobs
    assert len(served.answers) == 4 and most_at_once(runs) == 2
    assert min(r.start_s for r in runs) < 0.05  # from the first chat
    starts = sorted(r.start_s for r in runs)
    ends = sorted(r.end_s for r in runs if r.completed)
    assert ends and starts[2] <= ends[0] + 0.05  # a job ended, the next started at once
    assert all(r.start_s <= served.window_s for r in runs)  # none started after the window
    assert max(r.end_s for r in runs) >= served.window_s  # running until the last answer


@pytest.mark.parametrize("backend", ["eclectus", "openai"])
def test_closed_loop_jobs_running_at_the_end_leave_nothing_on_the_engine(
    embedded: Embedded, backend: str
) -> None:
    """Jobs too long for the window are cancelled when the last chat is answered, and their
    calls are cancelled on the engine (a compiled job's on the server, a stock one's by its
    closed HTTP request): nothing is left running for the next run."""
    target = embedded.target(backend)  # type: ignore[arg-type]
    before = scrape(embedded.metrics_url)["eclectus_calls_cancelled_total"]
    served = serve_once(mixed(400), target)
    assert [r.completed for r in served.jobs] == [False, False]
    after = wait_until_idle(embedded.metrics_url, timeout_s=1.0)
    assert all(after.get(name, 0) == 0 for name in ENGINE_WORK), after
    assert after["eclectus_calls_cancelled_total"] >= before + 2
