"""One run of the load eval: a schedule's programs started at their arrival times (open
loop: an arrival never waits for an earlier program), then drained.

Each program is its own asyncio task; times are seconds after the run's start, and a
program's latency runs from its *scheduled* arrival, so a client that starts a program late
(a busy machine) pays for it as a user would. Programs still running ``drain_timeout_s``
after the last arrival are cancelled (their sessions closed, their HTTP requests dropped,
which aborts their calls on the server) and counted unfinished; a program that raises is
counted failed with its error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass

from eclectus.evals.load.mix import ProgramSpec
from eclectus.evals.load.programs import RunContext, close_session, run_program
from eclectus.recipes.shared_prompt import drop_cached_async_clients

# LangGraph runs a graph's sync nodes (the tool agent's) on the loop's default executor;
# with the default's handful of threads, concurrent agents would queue on the client
CLIENT_THREADS = 512


@dataclass(frozen=True, slots=True)
class ProgramRecord:
    """What one program did. ``end_s`` None: unfinished (cancelled at the drain timeout);
    ``error``: it failed (the exception, one line)."""

    index: int
    kind: str
    shape: int
    arrival_s: float
    start_s: float | None = None
    end_s: float | None = None
    first_token_s: float | None = None  # a chat's first answer piece
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.end_s is not None and self.error is None

    @property
    def latency_s(self) -> float | None:
        """End-to-end: from the scheduled arrival to the final answer (finished only)."""
        return self.end_s - self.arrival_s if self.finished else None  # type: ignore[operator]

    @property
    def ttft_s(self) -> float | None:
        """A chat's time to first token, from its scheduled arrival."""
        if self.first_token_s is None or not self.finished:
            return None
        return self.first_token_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """A run's programs and how long it took (its start to the drain's end)."""

    records: list[ProgramRecord]
    wall_s: float


def run_schedule(specs: list[ProgramSpec], ctx: RunContext, drain_timeout_s: float) -> RunOutcome:
    """Run ``specs`` on ``ctx``'s target (blocking: a fresh event loop, as a fresh app
    start; network)."""
    drop_cached_async_clients()  # langchain_openai's clients are bound to a loop
    return asyncio.run(_run(specs, ctx, drain_timeout_s))


def run_alone(specs: list[ProgramSpec], ctx: RunContext) -> list[ProgramRecord]:
    """Each of ``specs`` alone, one after another, its arrival the moment it starts: the
    unloaded latencies (blocking; network)."""
    drop_cached_async_clients()
    return asyncio.run(_alone(specs, ctx))


async def _alone(specs: list[ProgramSpec], ctx: RunContext) -> list[ProgramRecord]:
    records = []
    for spec in specs:
        started = time.perf_counter()
        record = await _one(spec, ctx, started, started)
        records.append(record)
    return records


async def _run(specs: list[ProgramSpec], ctx: RunContext, drain_timeout_s: float) -> RunOutcome:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(CLIENT_THREADS))
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(_at_arrival(spec, ctx, t0)) for spec in specs]
    last_arrival = max((s.arrival_s for s in specs), default=0.0)
    deadline = t0 + last_arrival + drain_timeout_s
    done, pending = await asyncio.wait(tasks, timeout=max(deadline - time.perf_counter(), 0))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    records = []
    for spec, task in zip(specs, tasks, strict=True):
        if task in done:
            records.append(task.result())
        else:  # cancelled at the drain timeout
            records.append(ProgramRecord(spec.index, spec.kind, spec.shape, spec.arrival_s))
    return RunOutcome(records, time.perf_counter() - t0)


async def _at_arrival(spec: ProgramSpec, ctx: RunContext, t0: float) -> ProgramRecord:
    await asyncio.sleep(max(0.0, t0 + spec.arrival_s - time.perf_counter()))
    return await _one(spec, ctx, t0, t0 + spec.arrival_s)


async def _one(spec: ProgramSpec, ctx: RunContext, t0: float, arrival: float) -> ProgramRecord:
    """Run one program, then close its session; its record, times after ``t0`` (network)."""
    start = time.perf_counter()
    first: list[float] = []
    error = None
    try:
        await run_program(spec, ctx, lambda: first.append(time.perf_counter()))
    except Exception as exc:  # a failed program is a result, not the end of the run
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    finally:
        end = time.perf_counter()
        # after the answer (the stock apps have no session to close) and on a thread: the
        # close waits for the server's reply, which would stall every other program's client
        await asyncio.to_thread(close_session, spec, ctx)
    if error is not None:
        return ProgramRecord(
            spec.index, spec.kind, spec.shape, arrival - t0, start - t0, None, None, error
        )
    return ProgramRecord(
        spec.index,
        spec.kind,
        spec.shape,
        arrival - t0,
        start - t0,
        end - t0,
        first[0] - t0 if first else None,
    )
