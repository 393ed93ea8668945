"""The batch knee (batch_knee.py, ``--max-engine-seqs auto``): the step-time fit, the cap it
gives, the in-flight integral on a fake clock, and the scheduler learning it from an engine
whose step time grows with its batch."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sched_helpers import drain, make_scheduler, submit
from test_admission import CappedEngine, map_frame

from eclectus.server.backend import EngineOutput, EngineRequest
from eclectus.server.config import ServerConfig
from eclectus.server.graph.batch_knee import BatchKnee


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fed(t0: float, c: float, batches: list[float], **kwargs: float) -> BatchKnee:
    knee = BatchKnee(**kwargs)  # type: ignore[arg-type]
    for b in batches:
        knee.add(batch=b, step_s=t0 + c * b)
    return knee


@given(
    t0=st.floats(1e-4, 0.05),
    c=st.floats(1e-5, 0.01),
    fraction=st.floats(0.5, 0.95),
)
def test_the_fit_recovers_a_linear_step_time_and_the_cap_is_its_knee(
    t0: float, c: float, fraction: float
) -> None:
    knee = fed(t0, c, [1 + (i % 32) for i in range(64)], fraction=fraction)
    fit = knee.fit()
    assert fit is not None
    assert fit.t0 == pytest.approx(t0, rel=1e-6, abs=1e-9)
    assert fit.c == pytest.approx(c, rel=1e-6)
    expected = fraction * t0 / (c * (1 - fraction))
    cap = knee.cap(ceiling=10**7)
    assert max(math.floor(expected), 4) <= cap <= max(math.ceil(expected) + 1, 4)
    # at the cap the throughput b / t(b) is the fraction of its limit 1 / c (to rounding)
    assert cap / (t0 + c * cap) >= fraction / c * (1 - 1e-6)
    assert knee.cap(ceiling=3) == 3  # never above the engine's own batch


@given(
    t0=st.floats(1e-4, 0.05),
    c=st.floats(1e-5, 0.01),
    p=st.floats(1e-7, 1e-4),
    seed=st.integers(0, 2**16),
)
def test_the_arrivals_prefill_is_fitted_apart_from_the_batch(
    t0: float, c: float, p: float, seed: int
) -> None:
    """Under load the prefill per step grows with the batch; its cost must not be charged
    to the batch, or the knee moves with the arrivals."""
    rng = random.Random(seed)
    knee = BatchKnee()
    for i in range(100):
        b = 1 + i % 32
        q = 20.0 * b + rng.uniform(0, 400)  # correlated with the batch, not only that
        knee.add(batch=b, step_s=t0 + c * b + p * q, prefill=q)
    fit = knee.fit()
    assert fit is not None
    assert fit.c == pytest.approx(c, rel=1e-4)
    assert fit.p == pytest.approx(p, rel=1e-4)
    assert fit.t0 == pytest.approx(t0, rel=1e-4, abs=1e-8)


def test_nothing_known_leaves_the_engines_batch() -> None:
    assert BatchKnee().cap(ceiling=48) == 48  # no samples
    assert fed(0.01, 0.001, [8.0] * 100).cap(ceiling=48) == 48  # all at one batch size
    assert fed(0.01, 0.001, [1.0, 9.0] * 5).cap(ceiling=48) == 48  # too few samples


def test_a_flat_step_time_leaves_the_engines_batch_and_a_proportional_one_the_floor() -> None:
    assert fed(0.01, 0.0, [1 + i % 16 for i in range(50)]).cap(ceiling=64) == 64
    assert fed(0.0, 0.002, [1 + i % 16 for i in range(50)]).cap(ceiling=64) == 4


def test_old_samples_fade() -> None:
    batches = [1 + i % 16 for i in range(400)]
    knee = fed(0.002, 0.001, batches, memory=50)  # knee 18
    for b in batches:
        knee.add(batch=b, step_s=0.02 + 0.001 * b)  # the engine's fixed cost grew: knee 180
    fit = knee.fit()
    assert fit is not None and fit.t0 == pytest.approx(0.02, rel=1e-3)


def test_a_sample_is_the_mean_batch_in_flight_while_it_decoded() -> None:
    clock = Clock()
    knee = BatchKnee(clock=clock, min_weight=1, min_spread=0)
    knee.set_inflight(2, num_engines=2)  # one per engine
    mark = knee.mark(num_tokens=1)
    clock.now = 1.0
    knee.set_inflight(6, num_engines=2)  # three per engine for the second second
    knee.add_prefill(400)  # another request's prompt, 200 tokens per engine
    clock.now = 2.0
    knee.finish(mark, num_tokens=11)  # ten tokens after the first, in two seconds
    assert knee.weight == 1
    assert knee._sums["x"] == pytest.approx(2.0)  # (1 * 1 s + 3 * 1 s) / 2 s
    assert knee._sums["y"] == pytest.approx(0.2)
    assert knee._sums["z"] == pytest.approx(20.0)  # 200 tokens over its ten steps
    knee.finish(knee.mark(num_tokens=5), num_tokens=5)  # no token after the mark: no sample
    assert knee.weight == 1


def test_auto_is_a_config_value_and_bad_values_are_named() -> None:
    assert ServerConfig(port=0, max_engine_seqs="auto").max_engine_seqs == "auto"
    with pytest.raises(ValueError, match="max_engine_seqs"):
        ServerConfig(port=0, max_engine_seqs="many")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_engine_seqs"):
        ServerConfig(port=0, max_engine_seqs=0)
    with pytest.raises(ValueError, match="fraction"):
        BatchKnee(fraction=1.0)


class SteppedEngine(CappedEngine):
    """The capped engine stepping on a virtual clock, as a batched decode does: each step
    gives every request waiting on it its next output and takes ``t0 + c * batch`` seconds of
    ``clock``. The time is virtual so that a loaded machine (CI runs the tests in parallel)
    cannot stretch the steps: the fit sees exactly the engine's step time."""

    def __init__(self, max_seqs: int, t0: float, c: float) -> None:
        super().__init__(max_seqs=max_seqs)
        self.t0, self.c = t0, c
        self.clock = Clock()
        self.batches: list[int] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._stepper: asyncio.Task[None] | None = None

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        async for output in super().generate(request):
            await self._next_step()
            yield output

    async def _next_step(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.create_task(self._steps())
        await waiter

    async def _steps(self) -> None:
        while True:
            for _ in range(10):  # let the requests that just got an output come back
                await asyncio.sleep(0)
            if not self._waiting:
                return
            batch, self._waiting = self._waiting, []
            self.batches.append(len(batch))
            self.clock.now += self.t0 + self.c * len(batch)
            for waiter in batch:
                if not waiter.done():
                    waiter.set_result(None)


async def test_the_scheduler_learns_the_knee_from_the_engines_steps() -> None:
    engine = SteppedEngine(max_seqs=64, t0=0.003, c=0.001)  # knee at 0.9: 27
    sched = make_scheduler(engine, max_engine_seqs="auto", max_inflight=64)
    assert sched.admission.knee is not None
    sched.admission.knee = BatchKnee(clock=engine.clock)  # the engine's time, not the machine's
    assert sched.admission.max_inflight() == 64  # nothing learned: the engine's batch
    for i, width in enumerate((4, 12, 24, 40)):  # waves of different batch sizes
        submit(sched, sched.open_app(f"wave{i}"), **map_frame(f"m{i}", width))
        for _ in range(200):
            if not sched.num_inflight and not sched.queue:
                break
            await asyncio.sleep(0.02)
        await drain(sched, rounds=50)
    assert max(engine.batches) >= 24  # the waves did batch
    knee = sched.admission.knee
    fit = knee.fit()
    assert fit is not None
    # per token: a step gives each request a piece of about 3 tokens, so t0 / c holds
    assert fit.t0 / fit.c == pytest.approx(3.0, rel=0.05)
    assert 26 <= sched.admission.max_inflight() <= 28
    assert sched.gauges()["step_per_seq_seconds"] == fit.c


def test_serve_takes_auto() -> None:
    from eclectus.cli import build_parser

    args = build_parser(["serve"]).parse_args(["serve", "--max-engine-seqs", "auto"])
    assert args.max_engine_seqs == "auto"
    args = build_parser(["serve"]).parse_args(["serve", "--max-engine-seqs", "8"])
    assert args.max_engine_seqs == 8
