"""The measurement loop: every point of every sweep, every system, fresh input each run.

At each point: one warm-up run per system (discarded), then ``reps`` rounds in which every
system runs once, the order rotated each round so that no system always runs first or last;
before each run the servers that allow it empty their prefix cache, and the run's document is
the sample with a never-used letter permutation (:mod:`eclectus.evals.fresh`). Then the
critical-path lower bound is measured on each engine (median of ``bound_reps`` chains).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eclectus.evals.critical_path import critical_chain, measure_chain
from eclectus.evals.fresh import fresh_text
from eclectus.evals.servers import EclectusProcess
from eclectus.evals.systems import System
from eclectus.evals.trace import idle_within, read_spans
from eclectus.evals.workloads import RTT_FIELD, Sweep, Workload, replace_path
from eclectus.recipes import RECIPES, run_recipe
from eclectus.recipes.shared_prompt import drop_cached_async_clients
from eclectus.recipes.text import load_sample

UNKNOWN_RATIO_NOTE = "prefix-cache hit ratio unknown"  # run_recipe's note; we measure it here
# recipe details kept per run: "chat mean latency s", ..., and the background jobs' times
# ("analytics mean job s", "analytics all done s": what the chats' speed cost them)
LATENCY_SUFFIXES = ("latency s", " job s", " done s")
# ... and what the background got done beside the chats ("analytics jobs done", "analytics
# jobs cancelled", "analytics output tok/s"), so chat latency bought by starving it shows
THROUGHPUT_SUFFIXES = (" jobs done", " jobs cancelled", " tok/s")
FRAMES_COUNTER = "eclectus_client_frames_total"


# an engine-traced call's timeline label: whether it was throughput work nobody waited on
ENGINE_LABELS = {False: "foreground (latency)", True: "background (throughput)"}


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One measured run of one system at one sweep point."""

    workload: str
    field: str
    value: Any
    system: str
    rep: int  # -1: the warm-up
    wall_s: float
    metric: float
    num_calls: int
    depth: int
    prompt_tokens: float | None
    cached_tokens: float | None
    # (start, end, label) in seconds from the start; label: which part of the app (timeline)
    spans: list[tuple[float, float, str]] = field(default_factory=list)
    span_source: str = ""  # "engine" (server-side trace) or "client" (callbacks)
    notes: list[str] = field(default_factory=list)
    # client round trips: a compiled graph's frames, else one request per model call
    round_trips: int | None = None
    # the recipe's latency details (chat mean, p50, p90 ...), seconds by name
    latencies: dict[str, float] = field(default_factory=dict)
    # what crossed the delay proxy during the run (None without a delay): the client's
    # turns (each at most one round trip; proxy.py) and the connections it opened
    proxy_turns: int | None = None
    proxy_connections: int | None = None
    proxy_client_s: float | None = None  # the client's own time between hearing and sending
    # seconds of the run in which its engine ran none of its calls (engine spans only)
    engine_idle_s: float | None = None
    # the recipe's background throughput details (jobs done and cancelled, output tok/s)
    background: dict[str, float] = field(default_factory=dict)
    # the app's final output: every system of a round gets the same input (greedy), so the
    # report can say whose outputs equal the stock run's
    output: str = ""

    @property
    def cache_hit_ratio(self) -> float | None:
        if not self.prompt_tokens or self.cached_tokens is None:
            return None
        return self.cached_tokens / self.prompt_tokens

    @property
    def prefilled_tokens(self) -> float | None:
        """Prompt tokens the engine(s) computed: not served from a prefix cache."""
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class BoundRecord:
    """The critical-path lower bound at one sweep point, on one engine."""

    workload: str
    field: str
    value: Any
    engine: str
    seconds: float
    samples: list[float]
    num_calls: int


BOUND_REP = -2  # FailedRun.rep of a failed lower-bound measurement


@dataclass(frozen=True, slots=True)
class FailedRun:
    """A run that raised: kept out of the medians, listed in the report."""

    workload: str
    field: str
    value: Any
    system: str
    rep: int  # -1: the warm-up; BOUND_REP: the lower-bound measurement
    error: str  # "Type: message"


@dataclass
class Harness:
    """Runs workloads on ``systems``; ``log`` receives progress lines."""

    systems: list[System]
    reps: int = 5
    bound_reps: int = 3
    seed: int = 1
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    runs: list[RunRecord] = field(default_factory=list)
    bounds: list[BoundRecord] = field(default_factory=list)
    failures: list[FailedRun] = field(default_factory=list)
    _seeds: itertools.count[int] = field(init=False)
    _documents: dict[tuple[str, str, str, int], str] = field(init=False)

    def __post_init__(self) -> None:
        self._seeds = itertools.count(self.seed * 1_000_003)
        self._documents = {}  # (workload, field, value, rep) -> the round's input
        self._rtt_s = {s.name: s.rtt_s for s in self.systems}  # outside an rtt_ms sweep
        self._bound_cache: dict[tuple[str, str, str], BoundRecord] = {}

    def run_workload(self, workload: Workload) -> None:
        """Every point of every sweep of ``workload`` (mutates: appends records)."""
        for sweep in workload.sweeps:
            for value in sweep.values:
                self.run_point(workload, sweep, value)

    def run_point(self, workload: Workload, sweep: Sweep, value: Any) -> None:
        """Warm-up, ``reps`` rotated rounds, then the lower bounds (mutates). A point of an
        ``rtt_ms`` sweep runs the base params with that client round trip on every system;
        the servers, and the lower bound (measured without a delay), are the same."""
        swept_rtt = sweep.field == RTT_FIELD
        params = workload.base if swept_rtt else replace_path(workload.base, sweep.field, value)
        for system in self.systems:
            system.set_rtt(value / 1000 if swept_rtt else self._rtt_s[system.name])
        for rep in range(-1, self.reps):
            shift = max(rep, 0) % len(self.systems)
            for system in self.systems[shift:] + self.systems[:shift]:
                try:
                    record = self.run_once(workload, params, sweep.field, value, system, rep)
                except Exception as exc:  # one failed run must not lose the whole eval
                    self._record_failure(workload, sweep.field, value, system, rep, exc)
                    continue
                self.runs.append(record)
                self.log(
                    f"{workload.name} {sweep.field}={value} {system.name} rep {rep}: "
                    f"{workload.metric} {record.metric:.3f}"
                )
        for engine, system in {s.engine: s for s in self.systems}.items():
            # the bound runs without the delay: one per (params, engine) serves every rtt_ms
            same = self._bound_cache.get((workload.name, repr(params), engine))
            if same is not None:
                self.bounds.append(dataclasses.replace(same, field=sweep.field, value=value))
                continue
            try:
                bound = self.measure_bound(workload, params, sweep.field, value, engine, system)
            except Exception as exc:
                self._record_failure(workload, sweep.field, value, system, BOUND_REP, exc)
                continue
            self.bounds.append(bound)
            self._bound_cache[workload.name, repr(params), engine] = bound

    def _record_failure(
        self,
        workload: Workload,
        field_name: str,
        value: Any,
        system: System,
        rep: int,
        exc: Exception,
    ) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self.failures.append(FailedRun(workload.name, field_name, value, system.name, rep, error))
        self.log(f"{workload.name} {field_name}={value} {system.name} rep {rep}: FAILED {error}")

    def run_once(
        self, workload: Workload, params: Any, field_name: str, value: Any, system: System, rep: int
    ) -> RunRecord:
        """One run of ``system`` on the round's fresh input, the same for every system of
        the round (mutates: the server's cache and counters)."""
        round_key = (workload.name, field_name, repr(value), rep)
        if round_key not in self._documents:
            self._documents[round_key] = self._fresh_document(workload)
        text = self._documents[round_key]
        server = system.server
        if server is not None:
            server.reset_prefix_cache()
        drop_cached_async_clients()
        before = _counters(system)
        target = system.target()  # starts the proxy, so that its counts are the run's own
        system.new_run()
        crossed = system.traffic()
        started_epoch = time.time()
        result = run_recipe(workload.recipe, params, target, text=text)
        traffic = None if crossed is None else system.traffic() - crossed  # type: ignore[operator]
        spans, source = self._spans(system, result, started_epoch)
        prompt, cached = _token_delta(system, before)
        metric = (
            result.wall_s if workload.metric == "wall_s" else float(result.details[workload.metric])
        )
        notes = [n for n in result.notes if not n.startswith(UNKNOWN_RATIO_NOTE)]
        latencies = _details(result.details, LATENCY_SUFFIXES)
        return RunRecord(
            workload.name,
            field_name,
            value,
            system.name,
            rep,
            result.wall_s,
            metric,
            result.num_calls,
            result.depth,
            prompt,
            cached,
            spans,
            source,
            notes,
            _round_trips(system, result),
            latencies,
            None if traffic is None else traffic.turns,
            None if traffic is None else traffic.connections,
            None if traffic is None else traffic.client_s,
            idle_within([(a, b) for a, b, _ in spans], result.wall_s)
            if source == "engine"
            else None,
            _details(result.details, THROUGHPUT_SUFFIXES),
            result.output,
        )

    def measure_bound(
        self,
        workload: Workload,
        params: Any,
        field_name: str,
        value: Any,
        engine: str,
        system: System,
    ) -> BoundRecord:
        """The median time of the critical chain alone on ``engine`` (mutates: its cache)."""
        samples = []
        for _ in range(self.bound_reps):
            calls = critical_chain(workload.recipe, params, self._fresh_document(workload))
            if system.server is not None:
                system.server.reset_prefix_cache()
            samples.append(measure_chain(*system.bound_endpoint(), calls))
        timed = sum(not call.prime for call in calls)
        self.log(
            f"{workload.name} {field_name}={value} lower bound on {engine}: "
            f"{statistics.median(samples):.3f} s ({timed} calls)"
        )
        return BoundRecord(
            workload.name, field_name, value, engine, statistics.median(samples), samples, timed
        )

    def _fresh_document(self, workload: Workload) -> str:
        return fresh_text(load_sample(RECIPES[workload.recipe].sample), next(self._seeds))

    def _spans(
        self, system: System, result: Any, started_epoch: float
    ) -> tuple[list[tuple[float, float, str]], str]:
        """The run's call spans: the engine's trace for an Eclectus server, else the
        client's callbacks. Both measured from the run's start."""
        server = system.server
        if isinstance(server, EclectusProcess) and server.trace_path is not None:
            offset = started_epoch
            traced = read_spans(server.trace_path, started_epoch, time.time())
            return [
                (s.start - offset, s.end - offset, ENGINE_LABELS[s.background]) for s in traced
            ], "engine"
        return [(s.start_s, s.end_s, s.label) for s in result.timeline], "client"


def _details(details: dict[str, Any], suffixes: tuple[str, ...]) -> dict[str, float]:
    """The recipe's details whose names end with one of ``suffixes``, as floats (pure)."""
    return {k: float(v) for k, v in details.items() if k.endswith(suffixes)}


def _round_trips(system: System, result: Any) -> int | None:
    """The run's client round trips: the frames a compiled graph sent (the recipe's count,
    else the Eclectus server's received-frames counter, which includes the session's
    hello); a stock client's one request per model call (pure)."""
    frames = result.details.get("client frames")
    if frames is not None:
        return int(frames)
    if system.backend == "eclectus":
        counted = result.server_counters.get(FRAMES_COUNTER)
        return None if counted is None else int(counted)
    return int(result.num_calls)


def _counters(system: System) -> dict[str, float] | None:
    """The system's server counters, None when they cannot be read (blocking I/O)."""
    if system.server is None:
        return None
    try:
        return system.server.counters()
    except OSError:
        return None


def _token_delta(
    system: System, before: dict[str, float] | None
) -> tuple[float | None, float | None]:
    """(prompt tokens, prefix-cache hit tokens) the run added on the server."""
    after = _counters(system)
    if before is None or after is None or system.server is None:
        return None, None
    p0, h0 = system.server.token_counts(before)
    p1, h1 = system.server.token_counts(after)
    return p1 - p0, h1 - h0
