"""Background work beside the shared-prompt recipe's chats: when its analytics jobs start,
how they end, and what they got done.

Two ways to load the engine beside the chats:

- **open loop** (:func:`open_loop`): job ``k`` starts at its given time and runs to its end;
  the run waits for every job. How much of the chats' window the jobs cover depends on how
  fast the engine is: on a fast one each job ends long before the next starts.
- **closed loop** (:func:`closed_loop`): ``concurrency`` jobs are kept running, a new one
  starting the moment one ends, from the first chat until ``stop`` is set (the last chat
  answered): a batch job that keeps the engine busy for the whole window, whatever its
  speed. The jobs still running then are cancelled and awaited, so their calls end on the
  server too (a compiled run cancels its pending calls there, a stock client's closed HTTP
  request aborts its call): nothing of a run is left on the engine for the next one.

:func:`throughput_details` says what the jobs got done, so that a scheduler that buys chat
latency by starving the background shows the cost.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

RunJob = Callable[[int], Awaitable[object]]  # starts job k; its result is not kept
Clock = Callable[[], float]  # seconds since the run's start


@dataclass(frozen=True, slots=True)
class JobRun:
    """One analytics job, times in seconds after the run's start."""

    index: int  # the job's number: which chunks it read
    start_s: float
    end_s: float  # when it completed, or when its cancellation had ended
    completed: bool  # False: cancelled at the end of the chats' window


def most_at_once(runs: Sequence[JobRun]) -> int:
    """The most jobs running at the same time (pure); a job ending when another starts
    does not overlap it."""
    edges = sorted([(r.start_s, 1) for r in runs] + [(r.end_s, -1) for r in runs])
    running = peak = 0
    for _, step in edges:  # at equal times the end (-1) sorts first
        running += step
        peak = max(peak, running)
    return peak


async def open_loop(run_job: RunJob, starts: Sequence[float], clock: Clock) -> list[JobRun]:
    """Job ``k`` started at ``starts[k]``, each run to its end; every job's run, in order."""

    async def one(index: int, at: float) -> JobRun:
        await asyncio.sleep(max(0.0, at - clock()))
        started = clock()
        await run_job(index)
        return JobRun(index, started, clock(), True)

    return list(await asyncio.gather(*(one(k, at) for k, at in enumerate(starts))))


async def closed_loop(
    run_job: RunJob, concurrency: int, stop: asyncio.Event, clock: Clock
) -> list[JobRun]:
    """``concurrency`` jobs kept running until ``stop`` is set, then the ones still running
    cancelled and awaited; every job's run, in start order. A job that fails cancels the
    others and raises its error."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    numbers = itertools.count()
    running: dict[asyncio.Task[object], tuple[int, float]] = {}
    runs: list[JobRun] = []
    stopped = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            while len(running) < concurrency:
                index = next(numbers)
                running[asyncio.create_task(run_job(index))] = (index, clock())
            done, _ = await asyncio.wait({*running, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopped}:
                index, started = running.pop(task)
                task.result()  # a failed job fails the run
                runs.append(JobRun(index, started, clock(), True))
    finally:
        stopped.cancel()
        runs += await _end(running, clock)
    return sorted(runs, key=lambda r: r.index)


async def _end(
    running: dict[asyncio.Task[object], tuple[int, float]], clock: Clock
) -> list[JobRun]:
    """Cancel the jobs still running and wait until each has ended, its cancellation
    included; a job that had completed first counts as completed, one that had failed
    raises its error."""
    finished = [task for task in running if task.done()]
    for task in running:
        task.cancel()  # a no-op on a finished one
    await asyncio.gather(*running, return_exceptions=True)
    for task in finished:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    ended = clock()
    return [
        JobRun(index, started, ended, not task.cancelled() and task.exception() is None)
        for task, (index, started) in running.items()
    ]


def throughput_details(
    runs: Sequence[JobRun], window_s: float, output_tokens_per_job: int
) -> dict[str, float | int]:
    """What the jobs got done (pure): completed and cancelled jobs, the completed jobs'
    output tokens per second over the run (from its start until the later of ``window_s``,
    the last chat's answer, and the last completed job's end), their mean duration."""
    completed = [r for r in runs if r.completed]
    span = max([window_s, *(r.end_s for r in completed)])
    details: dict[str, float | int] = {
        "analytics jobs done": len(completed),
        "analytics jobs cancelled": len(runs) - len(completed),
        "analytics output tok/s": len(completed) * output_tokens_per_job / span if span else 0.0,
    }
    if completed:
        details["analytics mean job s"] = statistics.fmean(r.end_s - r.start_s for r in completed)
    return details
