"""The load eval's numbers: per round, then over the rounds of a point.

A program's SLO is ``k`` times the unloaded latency of its type at its shape (its number of
maps, steps or engineers), measured on the reference system with nothing else running. A
program that failed or was still running at the drain timeout missed its SLO, and counts as
an infinitely late one in every latency percentile: a system that drops work cannot look
faster for it. Percentiles are nearest-rank.

Per round and program type: p50/p95/p99 end-to-end latency, the p95 *slowdown* (latency
over the program's unloaded latency: a type meets its SLO at a point when it is <= k), and
for chats the time to first token. Per round: programs completed per second and the goodput
(programs finished within their SLO per second, both over the arrival window), failed and
unfinished counts, the engines' preemptions, and where the engines' time went
(:class:`EngineTime`, from vLLM's own histograms). Over the rounds of a point: the median of
each, with its min-max.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from eclectus.evals.load.driver import ProgramRecord

INF = math.inf


@dataclass(frozen=True, slots=True)
class TypeRound:
    """One program type in one round."""

    num_programs: int
    p50_s: float
    p95_s: float
    p99_s: float
    p95_slowdown: float
    ttft_p50_s: float | None = None  # chats only
    ttft_p95_s: float | None = None


# vLLM's histograms EngineTime reads (each as its _sum and _count)
ITL = "vllm:inter_token_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"
ENGINE_TIMES = tuple(f"{h}_{part}" for h in (ITL, QUEUE) for part in ("sum", "count"))


@dataclass(frozen=True, slots=True)
class EngineTime:
    """Where one run's engine time went, from vLLM's histograms' sums and counts read
    before and after it: ``itl_s`` the mean inter-token latency (what a decoding request
    waits per token: the step time at the batch it ran in), ``queue_s`` the mean time a
    request waited in vLLM's queue, ``decoding`` the mean number of requests decoding per
    engine over the run (Little's law: the summed inter-token time, which is every
    request's decode time, over the run's wall time)."""

    itl_s: float | None
    queue_s: float | None
    decoding: float | None

    @classmethod
    def between(
        cls, before: dict[str, float], after: dict[str, float], wall_s: float, engines: int
    ) -> EngineTime:
        """From two readings of :data:`ENGINE_TIMES` (pure)."""

        def delta(name: str) -> float:
            return after[name] - before[name]

        def mean(stem: str) -> float | None:
            count = delta(f"{stem}_count")
            return delta(f"{stem}_sum") / count if count > 0 else None

        return cls(
            itl_s=mean(ITL),
            queue_s=mean(QUEUE),
            decoding=delta(f"{ITL}_sum") / (wall_s * engines) if wall_s > 0 and engines else None,
        )


@dataclass(frozen=True, slots=True)
class RoundSummary:
    """One system's run at one rate."""

    types: dict[str, TypeRound]
    num_programs: int
    completed_per_s: float
    goodput_per_s: float
    within_slo: float  # fraction of the programs
    num_failed: int
    num_unfinished: int
    num_preemptions: float | None
    engine: EngineTime | None = None  # None without vLLM's histograms


@dataclass(frozen=True, slots=True)
class Spread:
    """A median over rounds and its range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True, slots=True)
class PointSummary:
    """The rounds of one (system, variant, rate), summarised."""

    rounds: list[RoundSummary] = field(default_factory=list)

    def spread(self, metric: str) -> Spread | None:
        """A RoundSummary field over the rounds (pure)."""
        values = [getattr(r, metric) for r in self.rounds if getattr(r, metric) is not None]
        return Spread.of(values) if values else None

    def engine_spread(self, metric: str) -> Spread | None:
        """An EngineTime field over the rounds that have one (pure)."""
        values = [
            v for r in self.rounds if r.engine and (v := getattr(r.engine, metric)) is not None
        ]
        return Spread.of(values) if values else None

    def type_spread(self, kind: str, metric: str) -> Spread | None:
        """A TypeRound field of ``kind`` over the rounds (pure)."""
        values = [
            getattr(r.types[kind], metric)
            for r in self.rounds
            if kind in r.types and getattr(r.types[kind], metric) is not None
        ]
        return Spread.of(values) if values else None

    def worst_slowdown(self) -> float:
        """The largest of the types' median p95 slowdowns: the point meets an SLO of ``k``
        when it is <= k (pure; inf with no rounds, or with a type never measured; 0 with
        rounds of no programs)."""
        if not self.rounds:
            return INF
        kinds = {kind for r in self.rounds for kind in r.types}
        spreads = [self.type_spread(kind, "p95_slowdown") for kind in kinds]
        if any(s is None for s in spreads):
            return INF
        return max((s.median for s in spreads if s is not None), default=0.0)

    def meets_slo(self, k: float) -> bool:
        """Every type's median p95 slowdown within ``k`` (pure)."""
        return self.worst_slowdown() <= k


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of ``values`` (pure; inf allowed)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def unloaded_latencies(records: list[ProgramRecord]) -> dict[tuple[str, int], float]:
    """The median latency of each (type, shape) run alone (pure). ValueError naming one
    that never finished: no SLO can be set without it."""
    samples: dict[tuple[str, int], list[float]] = defaultdict(list)
    missing: set[tuple[str, int]] = set()
    for r in records:
        if r.latency_s is None:
            missing.add((r.kind, r.shape))
        else:
            samples[r.kind, r.shape].append(r.latency_s)
    lost = missing - set(samples)
    if lost:
        kind, shape = sorted(lost)[0]
        raise ValueError(
            f"no unloaded run of {kind} (shape {shape}) finished on the reference: no SLO "
            "for it (see its failures in the log; --mix can leave the type out)"
        )
    return {key: statistics.median(values) for key, values in samples.items()}


def slowdown(record: ProgramRecord, unloaded: dict[tuple[str, int], float]) -> float:
    """Latency over the unloaded latency of the program's type and shape; inf when it did
    not finish (pure)."""
    latency = record.latency_s
    return INF if latency is None else latency / unloaded[record.kind, record.shape]


def summarize_round(
    records: list[ProgramRecord],
    unloaded: dict[tuple[str, int], float],
    k: float,
    window_s: float,
    num_preemptions: float | None = None,
    engine: EngineTime | None = None,
) -> RoundSummary:
    """One run's numbers; ``window_s``: its arrival window (pure)."""
    by_kind: dict[str, list[ProgramRecord]] = defaultdict(list)
    for r in records:
        by_kind[r.kind].append(r)
    types = {kind: _type_round(rs, unloaded) for kind, rs in sorted(by_kind.items())}
    finished = [r for r in records if r.finished]
    good = [r for r in finished if slowdown(r, unloaded) <= k]
    return RoundSummary(
        types=types,
        num_programs=len(records),
        completed_per_s=len(finished) / window_s,
        goodput_per_s=len(good) / window_s,
        within_slo=len(good) / len(records) if records else 0.0,
        num_failed=sum(r.error is not None for r in records),
        num_unfinished=sum(r.end_s is None and r.error is None for r in records),
        num_preemptions=num_preemptions,
        engine=engine,
    )


def _type_round(records: list[ProgramRecord], unloaded: dict[tuple[str, int], float]) -> TypeRound:
    latencies = [r.latency_s if r.latency_s is not None else INF for r in records]
    ttfts = [r.ttft_s if r.ttft_s is not None else INF for r in records if r.kind == "chat"]
    return TypeRound(
        num_programs=len(records),
        p50_s=percentile(latencies, 0.50),
        p95_s=percentile(latencies, 0.95),
        p99_s=percentile(latencies, 0.99),
        p95_slowdown=percentile([slowdown(r, unloaded) for r in records], 0.95),
        ttft_p50_s=percentile(ttfts, 0.50) if ttfts else None,
        ttft_p95_s=percentile(ttfts, 0.95) if ttfts else None,
    )


def max_rate_meeting_slo(points: dict[float, PointSummary], k: float) -> float | None:
    """The highest swept rate up to which (that rate and every lower one) every type's
    p95 meets the SLO; None when the lowest does not (pure)."""
    best = None
    for rate in sorted(points):
        if not points[rate].meets_slo(k):
            break
        best = rate
    return best


class SloCrossing(NamedTuple):
    """Where a series' worst type reaches its SLO: ``rate``, interpolated between two swept
    rates, or, ``interpolated`` False, the highest swept rate meeting it (a lower bound)."""

    rate: float
    interpolated: bool


def slo_crossing(points: dict[float, PointSummary], k: float) -> SloCrossing | None:
    """Where the worst type's p95 slowdown crosses ``k``, between the highest rate meeting
    the SLO (:func:`max_rate_meeting_slo`) and the next swept rate, interpolated linearly in
    the rate. A knee read off the swept rates alone moves in whole grid
    steps; this one moves with the slowdowns. Where no rate past the best was swept, or the
    next one left programs unfinished (an infinite slowdown), the best rate, not
    interpolated: a lower bound. None when the lowest rate misses (pure). Linear in
    between: where slowdown grows faster than linearly toward saturation, as it does, the
    crossing read is early."""
    best = max_rate_meeting_slo(points, k)
    if best is None:
        return None
    above = [rate for rate in sorted(points) if rate > best]
    if not above:
        return SloCrossing(best, False)
    low, high = points[best].worst_slowdown(), points[above[0]].worst_slowdown()
    if math.isinf(high):
        return SloCrossing(best, False)
    return SloCrossing(best + (k - low) / (high - low) * (above[0] - best), True)


@dataclass(frozen=True, slots=True)
class Drain:
    """One capacity run: a burst of programs arriving at once, and how fast a system
    finished them. ``per_s``: programs finished per second, to the last one's end (every
    program finished) or to the drain timeout (a lower bound: some did not)."""

    num_programs: int
    num_finished: int
    per_s: float
    num_preemptions: float | None


def drained(drains: list[Drain]) -> Spread:
    """Programs/s drained over a series' capacity rounds (pure)."""
    return Spread.of([d.per_s for d in drains])


def drain(records: list[ProgramRecord], wall_s: float, num_preemptions: float | None) -> Drain:
    """A capacity run's :class:`Drain`: ``records`` all arrived at 0, ``wall_s`` the run's
    length to the drain's end (pure)."""
    finished = [r.end_s for r in records if r.finished and r.end_s is not None]
    span = max(finished) if len(finished) == len(records) and finished else wall_s
    per_s = len(finished) / span if span > 0 else 0.0
    return Drain(len(records), len(finished), per_s, num_preemptions)
