"""The load eval's report.md and results.json.

report.md: the configuration, the SLO (each type's unloaded latencies on the reference), then
per app variant one table per rate (a row per system: programs completed per second, goodput,
share within the SLO, failed and unfinished programs, preemptions, each type's p95 latency and
the chats' time to first token), the per-type p50/p99 beside them, and the highest rate at
which every type's p95 met the SLO, with its ratio to the reference's; with capacity runs,
how fast each series drained a burst, against the reference's SLO crossing. Every figure is
the median over the rounds with its min-max.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from eclectus.evals.load.stats import (
    Drain,
    PointSummary,
    SloCrossing,
    Spread,
    drain,
    drained,
    max_rate_meeting_slo,
    slo_crossing,
)
from eclectus.evals.load.sweep import LoadSweep

Points = dict[str, dict[float, PointSummary]]  # series -> rate -> its rounds


def _fmt(spread: Spread | None, digits: int = 2, unit: str = "") -> str:
    if spread is None:
        return "–"

    def one(x: float) -> str:
        return "∞" if math.isinf(x) else f"{x:.{digits}f}"

    if spread.low == spread.high:
        return one(spread.median) + unit
    return f"{one(spread.median)}{unit} ({one(spread.low)}–{one(spread.high)})"


def _pct(spread: Spread | None) -> str:
    if spread is None:
        return "–"
    scaled = Spread(spread.median * 100, spread.low * 100, spread.high * 100)
    return _fmt(scaled, 0, "%")


def best_rates(points: Points, k: float) -> dict[str, float | None]:
    """Each series' highest rate meeting the SLO (pure)."""
    return {series: max_rate_meeting_slo(by_rate, k) for series, by_rate in points.items()}


def slo_crossings(points: Points, k: float) -> dict[str, SloCrossing | None]:
    """Each series' interpolated SLO crossing (:func:`slo_crossing`) (pure)."""
    return {series: slo_crossing(by_rate, k) for series, by_rate in points.items()}


def capacities(sweep: LoadSweep) -> dict[str, list[Drain]]:
    """Each series' capacity runs, round by round (pure)."""
    drains: dict[str, list[Drain]] = {}
    for run in sweep.bursts:
        drains.setdefault(run.series, []).append(
            drain(run.records, run.wall_s, run.num_preemptions)
        )
    return drains


def render(
    config: dict[str, Any],
    sweep: LoadSweep,
    points: Points,
    k: float,
    plots: list[str],
    drains: dict[str, list[Drain]],
) -> str:
    """report.md's text; ``drains``: :func:`capacities` (pure)."""
    kinds = sorted({r.kind for run in sweep.runs for r in run.records})
    lines = [
        "# Many programs at once (`eclectus eval load`)",
        "",
        f"- command: `{config['command']}`",
        f"- date: {config['date']}; machine: {config['machine']}; "
        f"CPU layout: {config.get('cpu_layout', 'shared')}",
        f"- mix: {', '.join(f'{t} {w:.0%}' for t, w in sweep.mix.items())}; "
        f"{sweep.duration_s:g} s of Poisson arrivals per run, drain timeout "
        f"{sweep.drain_timeout_s:g} s; {sweep.rounds} round(s) per rate, systems alternated",
        f"- SLO: {k:g} × each type's unloaded latency at its shape, on `{sweep.reference().name}`",
        f"- load average during the runs (1 min): {config['load_average']}",
        "",
        "## Unloaded latencies (the SLO's base)",
        "",
        "| type | shape | unloaded s | SLO s |",
        "|---|---|---|---|",
    ]
    for (kind, shape), seconds in sorted(sweep.unloaded.items()):
        lines.append(f"| {kind} | {shape or '–'} | {seconds:.3f} | {k * seconds:.2f} |")
    rates = best_rates(points, k)
    crossings = slo_crossings(points, k)
    reference = sweep.reference().name
    lines += ["", "## Highest rate at which every type's p95 meets the SLO", ""]
    lines += [
        "The crossing: where the worst type's median p95 slowdown reaches the SLO, "
        "interpolated between the highest rate meeting it and the next swept one (≥: no "
        "rate past it to interpolate to).",
        "",
        "| series | programs/s | ÷ reference | crossing | ÷ reference |",
        "|---|---|---|---|---|",
    ]
    for series, rate in rates.items():
        base, base_crossing = rates.get(reference), crossings.get(reference)
        ratio = f"{rate / base:.2f}" if rate and base else "–"
        crossing = crossings[series]
        shown, over = "none", "–"
        if crossing is not None:
            shown = f"{'' if crossing.interpolated else '≥ '}{crossing.rate:.2f}"
            if base_crossing and base_crossing.interpolated and crossing.interpolated:
                over = f"{crossing.rate / base_crossing.rate:.2f}"
        lines.append(
            f"| {series} | {rate if rate is not None else 'none'} | {ratio} | {shown} | {over} |"
        )
    lines += _capacity_table(drains, crossings.get(reference), reference)
    for rate in sweep.rates:
        lines += _rate_tables(rate, points, kinds)
    lines += _engine_table(sweep, points)
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _capacity_table(
    drains: dict[str, list[Drain]], base: SloCrossing | None, reference: str
) -> list[str]:
    """How fast each series drained its bursts, against the reference's SLO crossing; no
    lines without capacity runs (pure)."""
    if not drains:
        return []
    num = max(d.num_programs for runs in drains.values() for d in runs)
    lines = [
        "",
        f"## Capacity: {num} programs arriving at once",
        "",
        "Programs finished per second, to the last one's end. Arrivals that outpace it for "
        "long queue without bound under any order, so a series' capacity over the reference's "
        "SLO crossing is about the most its order could raise the knee over the reference's.",
        "",
        "| series | finished | drained/s | ÷ reference | preempt | ÷ reference's crossing |",
        "|---|---|---|---|---|---|",
    ]
    ref = drains.get(reference)
    ref_median = drained(ref).median if ref else None
    for series, runs in drains.items():
        per_s = drained(runs)
        preempted = [d.num_preemptions for d in runs if d.num_preemptions is not None]
        finished = f"{sum(d.num_finished for d in runs)}/{sum(d.num_programs for d in runs)}"
        ratio = f"{per_s.median / ref_median:.2f}" if ref_median else "–"
        ceiling = "–"
        if base is not None:  # ≤: the reference met every rate swept, a lower bound
            ceiling = f"{'' if base.interpolated else '≤ '}{per_s.median / base.rate:.2f}"
        lines.append(
            f"| {series} | {finished} | {_fmt(per_s)} | {ratio} | "
            f"{_fmt(Spread.of(preempted), 0) if preempted else '–'} | {ceiling} |"
        )
    return lines


def _rate_tables(rate: float, points: Points, kinds: list[str]) -> list[str]:
    head = "| series | completed/s | goodput/s | within SLO | failed | unfinished | preempt |"
    head += "".join(f" {k} p95 s |" for k in kinds) + " chat TTFT p95 s |"
    lines = ["", f"## {rate:g} programs/s", "", head, "|---" * (8 + len(kinds)) + "|"]
    for series, by_rate in points.items():
        point = by_rate.get(rate)
        if point is None:
            continue
        row = [
            series,
            _fmt(point.spread("completed_per_s")),
            _fmt(point.spread("goodput_per_s")),
            _pct(point.spread("within_slo")),
            _fmt(point.spread("num_failed"), 0),
            _fmt(point.spread("num_unfinished"), 0),
            _fmt(point.spread("num_preemptions"), 0),
            *(_fmt(point.type_spread(k, "p95_s")) for k in kinds),
            _fmt(point.type_spread("chat", "ttft_p95_s")),
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "| series |" + "".join(f" {k} p50 / p99 s |" for k in kinds),
        "|---" * (1 + len(kinds)) + "|",
    ]
    for series, by_rate in points.items():
        point = by_rate.get(rate)
        if point is None:
            continue
        cells = [
            f"{_fmt(point.type_spread(k, 'p50_s'))} / {_fmt(point.type_spread(k, 'p99_s'))}"
            for k in kinds
        ]
        lines.append(f"| {series} | " + " | ".join(cells) + " |")
    return lines


def _engine_table(sweep: LoadSweep, points: Points) -> list[str]:
    """Where vLLM's time went, per series and rate (stats.EngineTime), against the
    reference run alone; no lines when no series runs on vLLM (pure)."""
    alone = sweep.unloaded_engine
    rows = [
        (series, rate, point)
        for series, by_rate in points.items()
        for rate, point in by_rate.items()
        if point.engine_spread("itl_s") is not None
    ]
    if not rows:
        return []
    base = alone.itl_s if alone is not None else None
    lines = [
        "",
        "## Where vLLM's time went (its own histograms, per run)",
        "",
        "A decoding request waits one step per token: the inter-token latency is the step time "
        "at the batch it ran in, and its ratio to the unloaded one is the slowdown every "
        "decode token pays however its call was ordered. Decoding: the mean number of "
        "requests decoding per engine (Little's law over the run).",
        "",
        f"Unloaded (the reference alone): inter-token latency "
        f"{_ms(base)}, engine queue {_ms(alone.queue_s if alone else None)}, decoding "
        f"{_num(alone.decoding if alone else None)}.",
        "",
        "| series | programs/s | inter-token ms | × unloaded | decoding | vLLM queue ms |",
        "|---|---|---|---|---|---|",
    ]
    for series, rate, point in rows:
        itl = point.engine_spread("itl_s")
        ratio = f"{itl.median / base:.1f}" if itl is not None and base else "–"
        lines.append(
            f"| {series} | {rate:g} | {_fmt(_scaled(itl, 1000), 1)} | {ratio} | "
            f"{_fmt(point.engine_spread('decoding'), 1)} | "
            f"{_fmt(_scaled(point.engine_spread('queue_s'), 1000), 0)} |"
        )
    return lines


def _scaled(spread: Spread | None, factor: float) -> Spread | None:
    if spread is None:
        return None
    return Spread(spread.median * factor, spread.low * factor, spread.high * factor)


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{1000 * seconds:.1f} ms"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def write_results(
    path: Path,
    config: dict[str, Any],
    sweep: LoadSweep,
    points: Points,
    k: float,
    drains: dict[str, list[Drain]],
) -> None:
    """results.json: the configuration, the unloaded records and latencies, every run with
    every program, the per-round summaries and the highest rates (mutates disk)."""
    data = {
        "config": config,
        "slo_factor": k,
        "unloaded": [
            {"type": kind, "shape": shape, "seconds": s}
            for (kind, shape), s in sorted(sweep.unloaded.items())
        ],
        "unloaded_records": [dataclasses.asdict(r) for r in sweep.unloaded_records],
        "unloaded_engine": dataclasses.asdict(sweep.unloaded_engine)
        if sweep.unloaded_engine is not None
        else None,
        "runs": [dataclasses.asdict(run) for run in sweep.runs],
        "bursts": [dataclasses.asdict(run) for run in sweep.bursts],
        "capacity": {
            series: [dataclasses.asdict(d) for d in runs] for series, runs in drains.items()
        },
        "summary": {
            series: {
                f"{rate:g}": [dataclasses.asdict(r) for r in point.rounds]
                for rate, point in by_rate.items()
            }
            for series, by_rate in points.items()
        },
        "max_rate_meeting_slo": best_rates(points, k),
        "slo_crossing": {
            series: None if c is None else c._asdict()
            for series, c in slo_crossings(points, k).items()
        },
    }
    # an unfinished program's latency is infinite: JSON's Infinity, as Python writes it
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
