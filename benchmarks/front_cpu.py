"""What one hop through Eclectus costs in front of stock vLLM: ``python -m
eclectus.benchmarks.front_cpu --vllm-python /opt/vllm-venv/bin/python``.

One stock vLLM server (its API server and its EngineCore in two processes, the model run in
the EngineCore: ``VllmProcess``'s uni executor, as every eval runs it) and one ``eclectus
serve --engine-url`` in front of it. ``--cpu-layout apart`` runs the EngineCore on a core of
its own and everything else on the rest, as on a host whose accelerator is its own
(evals/cpus.py). vLLM's own client (``vllm.benchmarks.serve --backend openai --endpoint
/v1/completions --ignore-eos --request-rate inf``, evals/vllm_bench.py) runs each
workload straight at vLLM and through Eclectus, the order alternating per round, the prefix
cache emptied before each run. Around each run the CPU seconds (user + system, /proc) of
every process are read, so each path's front is charged per request: vLLM's API server
straight, Eclectus's process (plus vLLM's API server behind it) through Eclectus.

``--front-flags FLAGS``, repeated: one Eclectus front per set of ``eclectus serve`` flags, all
in front of the same vLLM and alternated with straight and with each other in every round,
so a flag's A/B (``--front-flags "" --front-flags "--admission off"``) is measured in one run.

``--py-spy DIR``: after the measured rounds, one more run per workload and path with
``py-spy record`` on the front (Eclectus's process, or vLLM's API server straight); the raw
stacks go to DIR and the top entries (self and total share of the busy samples per
function) are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import signal
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eclectus.benchmarks.front import cpu_seconds
from eclectus.evals.budget import Budget
from eclectus.evals.cpus import CpuLayout, add_layout_argument, children
from eclectus.evals.servers import (
    EclectusRemoteProcess,
    ServerProcess,
    VllmProcess,
    sum_counter,
)
from eclectus.evals.vllm_bench import WORKLOADS, run_bench

SPY_RATE = 200  # py-spy samples a second
# leaf frames where a thread waits rather than runs (py-spy's own idle check, which reads
# the OS thread state, misses these on a loaded machine); ``Runner.run`` as a leaf is
# uvloop's C loop (vLLM's API server), which polls there
IDLE_LEAVES = frozenset(
    {"_worker", "Condition.wait", "EpollSelector.select", "_PollLikeSelector.select", "Runner.run"}
)


def load_average() -> float:
    """The 1-minute load average (reads /proc)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


@dataclass
class Processes:
    """The pids whose CPU is charged: vLLM's API server and EngineCore, each Eclectus front
    (by its path's name)."""

    vllm_api: int
    vllm_core: list[int]
    fronts: dict[str, int]

    def sample(self) -> dict[str, float]:
        """CPU seconds so far, per role (reads /proc)."""
        return {
            "vllm_api": cpu_seconds(self.vllm_api),
            "vllm_core": sum(map(cpu_seconds, self.vllm_core)),
            **{path: cpu_seconds(pid) for path, pid in self.fronts.items()},
        }


def front_path(flags: str) -> str:
    """A front's path name in the tables: ``eclectus``, or ``eclectus <flags>`` (pure)."""
    return f"eclectus {flags}".strip()


@dataclass
class Run:
    workload: str
    path: str  # "straight" or a front's path name
    round: int
    num_requests: int
    metrics: dict[str, float]
    cpu_s: dict[str, float]  # per role, during the run
    load: float

    def cpu_ms_per_request(self, role: str) -> float:
        return 1000.0 * self.cpu_s[role] / self.num_requests

    def engine_wait_s(self) -> float:
        """The run's duration less the EngineCore's CPU seconds around it: how long the
        engine waited for work during the run, offset alike for every path by its idle
        polling while the client starts (pure). With the engine on a core of its own
        (``--cpu-layout apart``) its CPU seconds are its busy time, so a hop that held work
        back from it shows here, whatever the machine's speed did to the duration."""
        return self.metrics["duration"] - self.cpu_s["vllm_core"]

    def front_role(self) -> str:
        """The process that fronted this run: vLLM's API server straight, else the front."""
        return "vllm_api" if self.path == "straight" else self.path


def num_prompts(workload: str) -> int:
    args = WORKLOADS[workload]
    return int(args[args.index("--num-prompts") + 1])


def measure(
    python: str, server: ServerProcess, procs: Processes, workload: str, seed: int, out: Path
) -> tuple[dict[str, float], dict[str, float], float]:
    """One client run (blocking); its metrics (the client's, and ``engine_steps``: the
    steps vLLM ran for it), the CPU each role spent during it, the load."""
    before, steps = procs.sample(), engine_steps(server)
    metrics = run_bench(python, server, Path(server.model_dir), workload, seed, out)
    after = procs.sample()
    metrics["engine_steps"] = engine_steps(server) - steps
    return metrics, {k: after[k] - before[k] for k in after}, load_average()


def engine_steps(server: ServerProcess) -> float:
    """The steps vLLM has run so far (its ``vllm:iteration_tokens_total`` histogram's
    count; through a front, its engines' summed) (blocking I/O)."""
    return sum_counter(server.counters(), "vllm:iteration_tokens_total_count")


@contextlib.contextmanager
def py_spy(pid: int, out: Path) -> Iterator[None]:
    """``py-spy record`` on ``pid`` (raw stacks) while the block runs."""
    exe = Path(sys.executable).with_name("py-spy")
    cmd = [str(exe), "record", "-p", str(pid), "-f", "raw", "-r", str(SPY_RATE), "-o", str(out)]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
        spy.wait(timeout=60)


def top_entries(raw: Path, n: int = 15) -> tuple[int, list[tuple[str, float, float]]]:
    """The busy samples of a py-spy raw file (idle waits left out) and (function, self %,
    total %) of the ``n`` functions with the most self samples among them (pure read)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    num_busy = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";")]
        if frames[-1].split(" (")[0] in IDLE_LEAVES:
            continue
        num_busy += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            total[frame] += int(count)
    ranked = sorted(total, key=lambda f: (-own[f], -total[f]))[:n]
    busy = max(num_busy, 1)
    return num_busy, [(f, 100 * own[f] / busy, 100 * total[f] / busy) for f in ranked]


def _short(frame: str) -> str:
    """``fn (path/to/file.py:12)`` -> ``fn (file.py)``: one entry per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})" if where else name


def _spread(values: list[float], digits: int) -> str:
    """``median (min-max)``."""
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{med:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def table(runs: list[Run]) -> str:
    """Per workload and path: medians and ranges of duration, TTFT, CPU per request."""
    lines = [
        "| workload | path | duration s | TTFT ms | front CPU ms/req | vLLM API ms/req | "
        "EngineCore ms/req | engine waits s | engine steps | rounds | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for workload in dict.fromkeys(r.workload for r in runs):
        medians: dict[str, dict[str, float]] = {}
        for path in dict.fromkeys(r.path for r in runs):
            mine = [r for r in runs if (r.workload, r.path) == (workload, path)]
            if not mine:
                continue
            cols = {
                "duration": [r.metrics["duration"] for r in mine],
                "ttft": [r.metrics["mean_ttft_ms"] for r in mine],
                "front": [r.cpu_ms_per_request(r.front_role()) for r in mine],
                "api": [r.cpu_ms_per_request("vllm_api") for r in mine],
                "core": [r.cpu_ms_per_request("vllm_core") for r in mine],
                "wait": [r.engine_wait_s() for r in mine],
                "steps": [r.metrics.get("engine_steps", math.nan) for r in mine],
            }
            medians[path] = {k: statistics.median(v) for k, v in cols.items()}
            digits = {"duration": 2, "wait": 2, "steps": 0}
            cells = [_spread(v, digits.get(k, 1)) for k, v in cols.items()]
            loads = [r.load for r in mine]
            load = f"{min(loads):.1f}-{max(loads):.1f}"
            lines.append(f"| {workload} | {path} | {' | '.join(cells)} | {len(mine)} | {load} |")
        s = medians.get("straight")
        for path, e in medians.items():
            if s is None or path == "straight":
                continue
            paired = round_ratios(runs, workload, path)
            waits = round_wait_differences(runs, workload, path)
            lines.append(
                f"| {workload} | {path} / straight | {e['duration'] / s['duration']:.2f}x; "
                f"per round {_spread(paired, 2)}x | {e['ttft'] / s['ttft']:.2f}x | "
                f"{e['front'] / s['front']:.2f}x | | | {_spread(waits, 3)} more per round "
                "| | | |"
            )
    return "\n".join(lines)


def round_ratios(runs: list[Run], workload: str, path: str) -> list[float]:
    """``path``'s duration over straight's, round by round (pure): the two ran back to
    back, so a round's ratio sees the same machine state, which the medians' ratio over
    rounds whose loads drift does not."""
    straight = {r.round: r for r in runs if (r.workload, r.path) == (workload, "straight")}
    return [
        r.metrics["duration"] / straight[r.round].metrics["duration"]
        for r in runs
        if (r.workload, r.path) == (workload, path) and r.round in straight
    ]


def round_wait_differences(runs: list[Run], workload: str, path: str) -> list[float]:
    """How much longer the engine waited for work through ``path`` than straight, round by
    round, in seconds (pure; :meth:`Run.engine_wait_s`)."""
    straight = {r.round: r for r in runs if (r.workload, r.path) == (workload, "straight")}
    return [
        r.engine_wait_s() - straight[r.round].engine_wait_s()
        for r in runs
        if (r.workload, r.path) == (workload, path) and r.round in straight
    ]


def profile(
    python: str, paths: dict[str, ServerProcess], procs: Processes, workloads: list[str], out: Path
) -> None:
    """One more run per workload and path with py-spy on its front; print the top entries."""
    out.mkdir(parents=True, exist_ok=True)
    for workload in workloads:
        for path, pid in (*procs.fronts.items(), ("straight", procs.vllm_api)):
            raw = out / f"{path}-{workload}.txt"
            with py_spy(pid, raw):
                measure(python, paths[path], procs, workload, 999, out)
            num_busy, entries = top_entries(raw)
            ms = 1000 * num_busy / SPY_RATE / num_prompts(workload)
            print(f"\n{path} {workload} ({raw}): {ms:.1f} ms busy a request", flush=True)
            for name, own, total in entries:
                print(f"  {own:5.1f}% self {total:5.1f}% total  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--workloads", default="random,prefix-1x2048")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (+1 warm-up)")
    parser.add_argument(
        "--front-flags",
        action="append",
        help="more `eclectus serve` flags; repeat it for one front per set, alternated",
    )
    parser.add_argument("--py-spy", type=Path, default=None, help="profile the fronts into DIR")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "front-cpu")
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    add_layout_argument(parser)
    args = parser.parse_args(argv)
    try:
        layout = CpuLayout.parse(args.cpu_layout)
    except ValueError as exc:
        parser.error(str(exc))
    layout.pin_self()  # the servers and vLLM's bench client start off the engine cores
    from eclectus.models.presets import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    workloads = args.workloads.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget()
    vllm = VllmProcess(
        "vllm",
        model_dir,
        budget,
        args.out / "vllm.log",
        python=args.vllm_python,
        served_name=model_dir.name,
        startup_timeout_s=args.startup_timeout,
        cpus=layout,
    )
    fronts = {
        front_path(flags): EclectusRemoteProcess(
            f"eclectus-{i}",
            model_dir,
            budget,
            args.out / f"eclectus-{i}.log",
            serve_flags=tuple(flags.split()),
            engines=[vllm],
            startup_timeout_s=args.startup_timeout,
            cpus=layout,
        )
        for i, flags in enumerate(args.front_flags or [""])
    }
    if len(fronts) < len(args.front_flags or [""]):
        parser.error("--front-flags: each set must differ")
    runs: list[Run] = []
    try:
        vllm.start()
        for front in fronts.values():
            front.start()
        assert vllm.proc is not None
        pids = {path: front.proc.pid for path, front in fronts.items() if front.proc is not None}
        procs = Processes(vllm.proc.pid, children(vllm.proc.pid), pids)
        paths: dict[str, ServerProcess] = {"straight": vllm, **fronts}
        for r in range(args.rounds + 1):  # round 0 warms up
            shift = r % len(paths)  # each path takes each place in the order in turn
            order = [*list(paths)[shift:], *list(paths)[:shift]]
            for workload in workloads:
                for path in order:
                    metrics, cpu, load = measure(
                        args.vllm_python, paths[path], procs, workload, 1000 + r, args.out
                    )
                    run = Run(workload, path, r, num_prompts(workload), metrics, cpu, load)
                    per_req = {k: round(run.cpu_ms_per_request(k), 2) for k in cpu}
                    print(
                        f"round {r} {workload} {path}: {metrics} cpu ms/req {per_req} load {load}"
                    )
                    if r:
                        runs.append(run)
        print(table(runs), flush=True)
        if args.py_spy is not None:
            profile(args.vllm_python, paths, procs, workloads, args.py_spy)
    finally:
        for front in fronts.values():
            front.stop()
        vllm.stop()
    print(f"CPU layout: {layout.describe()}")
    print(datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
