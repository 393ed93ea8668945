"""The measurement loop of the load eval: unloaded latencies, then every rate, every round,
every system and app variant, alternated.

1. **Unloaded**: on the reference system (stock vLLM when it is in the run), every type at
   every shape runs alone ``unloaded_reps`` times after one warm-up pass; the medians are
   what the SLO multiplies. Every other system gets the warm-up pass too (discarded);
   ``warmup=False`` (``--quick``, which checks shape, not speed) skips it.
2. **Sweep**: at each rate, ``rounds`` rounds; a round draws one schedule (its own seed:
   arrivals, types, shapes and inputs) that every *series* (a system with one app variant)
   then runs, the order rotated each round so drift hits every series alike. Before each
   run the engines are let settle (nothing running) and their prefix caches emptied where
   they allow it; the run's preemptions are the engines' counter before and after, and so
   is where vLLM's time went (stats.EngineTime; the unloaded runs' too, for comparison).
3. **Capacity** (``capacity_programs`` > 0): per round, ``capacity_programs`` programs of the
   mix arriving at once, run on every series as a sweep round is; how fast each drains the
   backlog is the most programs/s it sustains (stats.drain). A rate above it
   queues without bound, so no order meets every SLO there for long.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from eclectus.evals.load.driver import ProgramRecord, run_alone, run_schedule
from eclectus.evals.load.mix import ProgramSpec, Sizes, burst, schedule, unloaded_schedule
from eclectus.evals.load.programs import RunContext, Variant, run_handbook
from eclectus.evals.load.stats import EngineTime, unloaded_latencies
from eclectus.evals.load.systems import LoadSystem


@dataclass(frozen=True, slots=True)
class Series:
    """One line of the report: a system with one app variant ("stock" for stock apps)."""

    system: LoadSystem
    variant: str

    @property
    def name(self) -> str:
        return self.system.name if self.variant == "stock" else f"{self.system.name}/{self.variant}"

    def context(self, sizes: Sizes, handbook: str, tag: str) -> RunContext:
        variant: Variant = "compiled" if self.variant == "compiled" else "swap"
        return RunContext(self.system.target(), variant, sizes, handbook, tag, self.system.priority)


@dataclass(frozen=True, slots=True)
class LoadRun:
    """One series' run at one rate in one round."""

    series: str
    rate: float
    round: int
    seed: int
    window_s: float  # the arrival window (the schedule's duration)
    wall_s: float
    records: list[ProgramRecord]
    num_preemptions: float | None
    load_average: tuple[float, float, float]  # the machine's, as the run ended
    engine: EngineTime | None = None  # None: engines without vLLM's histograms


@dataclass
class LoadSweep:
    """The sweep's settings and what it measured (``runs``, ``unloaded``)."""

    systems: list[LoadSystem]
    mix: dict[str, float]
    sizes: Sizes
    rates: tuple[float, ...]
    duration_s: float
    rounds: int
    drain_timeout_s: float
    unloaded_reps: int = 3
    seed: int = 1
    warmup: bool = True
    capacity_programs: int = 0  # a burst of this many per round; 0: no capacity runs
    log: Callable[[str], None] = print
    runs: list[LoadRun] = field(default_factory=list)
    bursts: list[LoadRun] = field(default_factory=list)  # the capacity runs (rate: inf)
    unloaded: dict[tuple[str, int], float] = field(default_factory=dict)
    unloaded_records: list[ProgramRecord] = field(default_factory=list)
    unloaded_engine: EngineTime | None = None  # the reference's engine, run alone

    @property
    def series(self) -> list[Series]:
        return [Series(s, v) for s in self.systems for v in s.variants]

    def reference(self) -> Series:
        """Whose unloaded latencies set the SLO: stock vLLM if present, else the first
        series (pure)."""
        return next((s for s in self.series if s.system.name == "vllm"), self.series[0])

    def measure_unloaded(self) -> None:
        """Warm every series up (unless ``warmup`` is off); then the reference's unloaded
        latencies (mutates)."""
        handbook = run_handbook(self.seed, self.sizes)
        warm = unloaded_schedule(self.mix, self.sizes, 1, self.seed)
        for series in self.series if self.warmup else []:
            records = run_alone(warm, series.context(self.sizes, handbook, f"warm-{series.name}"))
            failed = [r.error for r in records if r.error]
            self.log(
                f"warmed {series.name}"
                + (f" ({len(failed)} failed: {failed[0]})" if failed else "")
            )
        reference = self.reference()
        specs = unloaded_schedule(self.mix, self.sizes, self.unloaded_reps, self.seed + 1)
        ctx = reference.context(self.sizes, handbook, "unloaded")
        before, started = reference.system.engine_times(), time.monotonic()
        self.unloaded_records = run_alone(specs, ctx)
        self.unloaded_engine = _engine_time(reference.system, before, time.monotonic() - started)
        self.unloaded = unloaded_latencies(self.unloaded_records)
        self.log(f"unloaded latencies on {reference.name}: " + ", ".join(
            f"{k}[{s}] {v:.2f} s" for (k, s), v in sorted(self.unloaded.items())
        ))  # fmt: skip

    def run(self) -> None:
        """Every rate, round and series, then the capacity runs if any (mutates ``runs``,
        ``bursts``)."""
        for rate in self.rates:
            for round_ in range(self.rounds):
                self.run_round(rate, round_)
        if self.capacity_programs:
            for round_ in range(self.rounds):
                self.run_burst(round_)

    def run_round(self, rate: float, round_: int) -> None:
        seed = self.seed * 1_000 + round_ * 97 + int(rate * 1_000)
        specs = schedule(rate, self.duration_s, self.mix, self.sizes, seed)
        for series in self._rotated(round_):
            run = self._run_series(series, specs, rate, round_, seed, self.duration_s)
            self.runs.append(run)
            self._log_run(f"rate {rate:g}", run, series)

    def run_burst(self, round_: int) -> None:
        """One capacity round: ``capacity_programs`` arriving at once, on every series
        (mutates ``bursts``)."""
        seed = self.seed * 1_000 + round_ * 97 + 777_777  # apart from every rate's seeds
        specs = burst(self.capacity_programs, self.mix, self.sizes, seed)
        for series in self._rotated(round_):
            run = self._run_series(series, specs, math.inf, round_, seed, 0.0)
            self.bursts.append(run)
            self._log_run(f"burst of {len(specs)}", run, series)

    def _rotated(self, round_: int) -> list[Series]:
        """The series in this round's order: rotated by one each round, so drift over the
        run hits every series alike (pure)."""
        order = self.series
        shift = round_ % len(order)
        return order[shift:] + order[:shift]

    def _run_series(
        self,
        series: Series,
        specs: list[ProgramSpec],
        rate: float,
        round_: int,
        seed: int,
        window_s: float,
    ) -> LoadRun:
        """``specs`` on ``series`` from a settled engine with an empty prefix cache
        (blocking; network)."""
        system = series.system
        system.settle()
        for engine in system.engines:
            engine.reset_prefix_cache()
        before = system.preemptions()
        times = system.engine_times()
        tag = f"r{round_}-{rate:g}-{series.name}"
        handbook = run_handbook(seed, self.sizes)
        outcome = run_schedule(
            specs, series.context(self.sizes, handbook, tag), self.drain_timeout_s
        )
        after = system.preemptions()
        preempted = after - before if before is not None and after is not None else None
        return LoadRun(
            series.name, rate, round_, seed, window_s, outcome.wall_s, outcome.records,
            preempted, os.getloadavg(), _engine_time(system, times, outcome.wall_s),
        )  # fmt: skip

    def _log_run(self, what: str, run: LoadRun, series: Series) -> None:
        done = sum(r.finished for r in run.records)
        limit = series.system.admitted_limit()
        self.log(
            f"{what} round {run.round} {series.name}: {done}/{len(run.records)} finished, "
            f"load {run.load_average[0]:.1f}"
            + (f", admitted limit {limit:g}" if limit is not None else "")
        )


def _engine_time(
    system: LoadSystem, before: dict[str, float] | None, wall_s: float
) -> EngineTime | None:
    """Where ``system``'s engines spent the ``wall_s`` since ``before`` was read (blocking
    I/O: reads them again); None for engines without vLLM's histograms."""
    after = system.engine_times()
    if before is None or after is None:
        return None
    return EngineTime.between(before, after, wall_s, len(system.engines))
