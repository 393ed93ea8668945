"""What a run of ``eclectus eval`` writes: results.json (everything measured) and report.md
(a table of medians, spreads and ratios per sweep point, with the plots)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eclectus.evals.harness import BOUND_REP, BoundRecord, FailedRun, RunRecord
from eclectus.evals.summary import STOCK_SYSTEMS, PointSummary
from eclectus.evals.workloads import Workload
from eclectus.recipes import (
    ChainSummaryParams,
    MapReduceParams,
    MultiAgentParams,
    PlanExecuteParams,
    SharedPromptParams,
)

HEADER = (
    "| point | system | median s | min–max s | ÷ reference | lower bound s | ÷ bound "
    "| prefix-cache hits | calls | prompt tokens | prefilled tokens | round trips "
    "| proxy turns | engine idle s | outputs equal to the stock run's (greedy) |"
)
RULE = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def write_results(
    path: Path,
    config: dict[str, Any],
    runs: list[RunRecord],
    bounds: list[BoundRecord],
    summary: list[PointSummary],
    failures: Sequence[FailedRun] = (),
) -> None:
    """results.json: the configuration, every run, every bound, the summary, the runs that
    failed (mutates disk)."""
    body = {
        "config": config,
        "summary": [asdict(s) for s in summary],
        "bounds": [asdict(b) for b in bounds],
        "runs": [asdict(r) for r in runs],
        "failures": [asdict(f) for f in failures],
    }
    path.write_text(json.dumps(body, indent=1, default=str) + "\n", encoding="utf-8")


def _num(value: float | None, fmt: str = "{:.3f}") -> str:
    return "–" if value is None else fmt.format(value)


def table_rows(summary: list[PointSummary]) -> list[str]:
    """Markdown rows of the summary table (pure)."""
    return [
        f"| {s.field}={s.value} | {s.system} | {s.median:.3f} | {s.low:.3f}–{s.high:.3f} "
        f"| {_num(s.vs_reference, '{:.2f}×')} | {_num(s.bound_s)} "
        f"| {_num(s.vs_bound, '{:.2f}×')} | {_num(s.cache_hit_ratio, '{:.0%}')} "
        f"| {s.num_calls} | {_num(s.prompt_tokens, '{:.0f}')} "
        f"| {_num(s.prefilled_tokens, '{:.0f}')} | {_num(s.round_trips, '{:.0f}')} "
        f"| {_num(s.proxy_turns, '{:.0f}')} | {_num(s.engine_idle_s)} | {_equal(s)} |"
        for s in summary
    ]


def _equal(s: PointSummary) -> str:
    """The outputs column: "N of M", "stock" for the system compared with, "–" without one
    (pure). A speed ratio between systems that answer differently compares unlike work."""
    if s.num_equal_outputs is None:
        return "stock" if s.num_compared == 0 and s.system in STOCK_SYSTEMS else "–"
    return f"{s.num_equal_outputs} of {s.num_compared}"


def latency_rows(summary: list[PointSummary]) -> list[str]:
    """A table of the recipes' latency details (chat mean, p50, p90, seconds) and, beside
    them, what their background got done (jobs completed and cancelled, output tokens per
    second): medians over the runs, when any run reported them (pure)."""
    names = list(dict.fromkeys(n for s in summary for n in s.latencies))
    jobs = list(dict.fromkeys(n for s in summary for n in s.background))
    if not names and not jobs:
        return []
    head = "| point | system | " + " | ".join(names + jobs) + " |"
    rule = "|---|---|" + "---:|" * (len(names) + len(jobs))
    rows = [
        f"| {s.field}={s.value} | {s.system} | "
        + " | ".join(
            [_num(s.latencies.get(n)) for n in names]
            + [_num(s.background.get(n), "{:.1f}") for n in jobs]
        )
        + " |"
        for s in summary
    ]
    return [head, rule, *rows, ""]


def _map_reduce_shape(p: MapReduceParams) -> str:
    chunks = (
        "one map per chunk of the document"
        if p.num_chunks is None
        else (f"{p.num_chunks} parallel maps")
    )
    return (
        f"{chunks} over {p.chunk_tokens}-token chunks ({p.map_tokens} tokens out each, at "
        f"most {p.width} at once), then the reduce ({p.reduce_tokens} tokens)"
    )


def describe(workload: Workload) -> str:
    """The shape of the workload as run, from its base parameters (pure): what the report
    says is what ran, whatever ``--set`` changed."""
    p = workload.base
    if isinstance(p, MapReduceParams):
        return _map_reduce_shape(p)
    if isinstance(p, ChainSummaryParams):
        steps = "one step per chunk" if p.num_chunks is None else f"{p.num_chunks} steps"
        return (
            f"refine chain of {steps} over {p.chunk_tokens}-token chunks, each waiting for the "
            f"previous summary ({p.summary_tokens} tokens)"
        )
    if isinstance(p, MultiAgentParams):
        return (
            f"an architect, then {p.files} engineers writing files in parallel on the shared "
            f"design ({p.code_tokens} tokens each), {p.rounds} review round(s)"
        )
    if isinstance(p, PlanExecuteParams):
        return (
            f"a planner ({p.plan_tokens} tokens) over a {p.goal_tokens}-token goal, then "
            f"{p.steps} executors in parallel ({p.step_tokens} tokens each), then the "
            f"synthesizer ({p.answer_tokens} tokens)"
        )
    if isinstance(p, SharedPromptParams):
        shape = (
            f"{p.requests} chats from {p.users} users sharing a {p.system_tokens}-token system "
            f"prompt, Poisson arrivals at {p.rate}/s, {p.answer_tokens}-token answers"
        )
        if p.background is not None and p.background_concurrency is not None:
            shape += (
                f"; beside them {p.background_concurrency} background "
                f"job{'s' if p.background_concurrency > 1 else ''} kept running "
                "from the first chat to the last answer (a new one starting when one ends, "
                f"those running at the end cancelled): {_map_reduce_shape(p.background)}"
            )
        elif p.background is not None and p.background_jobs == 1:
            shape += f"; beside them a background job: {_map_reduce_shape(p.background)}"
        elif p.background is not None:
            window = p.requests / p.rate
            shape += (
                f"; beside them {p.background_jobs} background jobs, one starting every "
                f"{window / p.background_jobs:.2g} s: {_map_reduce_shape(p.background)}"
            )
        return shape
    return workload.description or workload.recipe


def render_report(
    config: dict[str, Any],
    workloads: list[Workload],
    summary: list[PointSummary],
    plots: dict[str, list[str]],
    failures: Sequence[FailedRun] = (),
) -> str:
    """report.md's text (pure). ``plots`` maps a workload to its PNG file names; ``failures``
    are listed at the end (their runs are in no median)."""
    lines = [
        "# Eclectus evals",
        "",
        f"Command: `{config['command']}`",
        "",
        f"Date: {config['date']}. Machine: {config['machine']}. Model: `{config['model']}`. "
        f"Repetitions: {config['reps']} per system and point (after one warm-up run), "
        f"systems alternated; client round trip added: {config['rtt_ms']} ms"
        f" (each new connection's handshake charged: {config.get('proxy_handshake', 'on')}).",
        "",
        "Budgets (every engine): "
        + ", ".join(f"{k}={v}" for k, v in config["budget"].items())
        + f". CPU layout: {config.get('cpu_layout', 'shared')}.",
        "",
        "| system | what it is | threads |",
        "|---|---|---|",
    ]
    lines += [f"| {s['name']} | {s['description']} | {s['threads']} |" for s in config["systems"]]
    lines += [
        "",
        f"Reference for the ratios: `{config['reference']}` (÷ reference above 1: "
        "the reference was faster). Lower bound: the engine's time for the run's longest "
        "chain of dependent calls, sent alone one after another; ÷ bound is the "
        "system's median over its own engine's bound. Prefilled tokens: prompt tokens the "
        "engine(s) computed (prompt tokens minus prefix-cache hits, from the servers' own "
        "counters). Round trips: client frames of a compiled graph, one request per model "
        "call for a stock client. Proxy turns (with a round trip only): the times the "
        "client sent after hearing from the server, counted by the delay proxy (each at "
        "most one round trip; a new WebSocket session adds 2). Engine idle s (Eclectus "
        "servers): the run's seconds in which its engine had none of its calls. A point "
        "`rtt_ms=V` ran the base parameters with a V ms client round trip on every system.",
        "",
    ]
    for workload in workloads:
        rows = [s for s in summary if s.workload == workload.name]
        if not rows:
            continue
        metric = "end-to-end seconds" if workload.metric == "wall_s" else workload.metric
        lines += [
            f"## {workload.name}",
            "",
            f"{describe(workload)}. Metric: {metric}. Base parameters: `{workload.base}`.",
            "",
            HEADER,
            RULE,
            *table_rows(rows),
            "",
            *latency_rows(rows),
        ]
        lines += [f"![{name}]({name})" for name in plots.get(workload.name, [])]
        lines.append("")
    if failures:
        lines += ["## Failed runs", "", "Not in any median above.", ""]
        lines += [
            f"- {f.workload} {f.field}={f.value}, {f.system}, "
            f"{'lower bound' if f.rep == BOUND_REP else f'rep {f.rep}'}: {f.error}"
            for f in failures
        ]
        lines.append("")
    return "\n".join(lines)
