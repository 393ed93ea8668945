"""Medians, spreads and ratios of the measured runs (pure functions over the records)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from eclectus.evals.harness import BoundRecord, RunRecord


@dataclass(frozen=True, slots=True)
class PointSummary:
    """One system at one sweep point, over its measured (non-warm-up) runs.

    ``vs_reference``: this system's median over the reference system's (Eclectus when it
    ran): above 1, the reference was faster. ``vs_bound``: median over the critical-path
    lower bound of this system's engine.
    """

    workload: str
    field: str
    value: Any
    system: str
    num_runs: int
    median: float
    low: float
    high: float
    vs_reference: float | None
    bound_s: float | None
    vs_bound: float | None
    cache_hit_ratio: float | None
    num_calls: int
    prompt_tokens: float | None
    prefilled_tokens: float | None = None  # prompt tokens not served from a prefix cache
    round_trips: float | None = None  # client round trips per run
    latencies: dict[str, float] = field(default_factory=dict)  # median of each, seconds
    proxy_turns: float | None = None  # client turns through the delay proxy per run
    engine_idle_s: float | None = None  # seconds per run the engine had none of its calls
    background: dict[str, float] = field(default_factory=dict)  # median of each (jobs, tok/s)
    # runs whose final output equals the stock run's of the same round (same input, greedy),
    # out of the runs that have one; None for the stock system itself or without one
    num_equal_outputs: int | None = None
    num_compared: int = 0


# the system whose outputs the others' are compared with: the first of these that ran (stock
# vLLM; a stock server given by URL; the Eclectus engine driven the stock way)
STOCK_SYSTEMS = ("vllm", "vllm-nopc", "openai", "self")


def stock_system(runs: list[RunRecord]) -> str | None:
    """The run's stock system, None when no stock system ran (pure)."""
    ran = {r.system for r in runs}
    return next((s for s in STOCK_SYSTEMS if s in ran), None)


def equal_outputs(mine: list[RunRecord], runs: list[RunRecord]) -> tuple[int | None, int]:
    """How many of ``mine`` (one system's runs at one point) answered exactly what the stock
    system answered in the same round, and how many had a stock run to compare with
    (pure). None for the stock system itself."""
    stock = stock_system(runs)
    if stock is None or not mine or mine[0].system == stock:
        return None, 0
    outputs = {
        (r.workload, r.field, _key(r.value), r.rep): r.output for r in runs if r.system == stock
    }
    pairs = [
        (r.output, outputs[k])
        for r in mine
        if (k := (r.workload, r.field, _key(r.value), r.rep)) in outputs
    ]
    return sum(a == b for a, b in pairs), len(pairs)


def summarize(
    runs: list[RunRecord], bounds: list[BoundRecord], engines: dict[str, str], reference: str
) -> list[PointSummary]:
    """A summary per (workload, field, value, system), in the order runs first appear.
    ``engines`` maps a system to its engine (for its lower bound) (pure)."""
    measured = [r for r in runs if r.rep >= 0]
    keys = list(dict.fromkeys((r.workload, r.field, _key(r.value), r.system) for r in measured))
    bound_of = {(b.workload, b.field, _key(b.value), b.engine): b.seconds for b in bounds}
    medians = {k: statistics.median(r.metric for r in measured if _rkey(r) == k) for k in keys}
    out = []
    for key in keys:
        workload, field_name, value, system = key
        mine = [r for r in measured if _rkey(r) == key]
        ref = medians.get((workload, field_name, value, reference))
        bound = bound_of.get((workload, field_name, value, engines.get(system, system)))
        ratios = [r.cache_hit_ratio for r in mine if r.cache_hit_ratio is not None]
        prompts = [r.prompt_tokens for r in mine if r.prompt_tokens is not None]
        prefilled = [p for r in mine if (p := r.prefilled_tokens) is not None]
        trips = [r.round_trips for r in mine if r.round_trips is not None]
        turns = [r.proxy_turns for r in mine if r.proxy_turns is not None]
        idle = [r.engine_idle_s for r in mine if r.engine_idle_s is not None]
        median = medians[key]
        out.append(
            PointSummary(
                workload,
                field_name,
                mine[0].value,
                system,
                len(mine),
                median,
                min(r.metric for r in mine),
                max(r.metric for r in mine),
                median / ref if ref else None,
                bound,
                median / bound if bound else None,
                statistics.median(ratios) if ratios else None,
                int(statistics.median(r.num_calls for r in mine)),
                statistics.median(prompts) if prompts else None,
                statistics.median(prefilled) if prefilled else None,
                statistics.median(trips) if trips else None,
                _medians([r.latencies for r in mine]),
                statistics.median(turns) if turns else None,
                statistics.median(idle) if idle else None,
                _medians([r.background for r in mine]),
                *equal_outputs(mine, measured),
            )
        )
    return out


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each name's median over the runs that reported it (pure)."""
    names = dict.fromkeys(n for run in runs for n in run)
    return {n: statistics.median(run[n] for run in runs if n in run) for n in names}


def _key(value: Any) -> str:
    return repr(value)


def _rkey(record: RunRecord) -> tuple[str, str, str, str]:
    return record.workload, record.field, _key(record.value), record.system
