"""RemoteConfig: how ``eclectus serve`` reaches the engines it schedules for (frozen,
validated)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eclectus.server.checks import require_range
from eclectus.server.remote.kv_subscriber import KVEventsEndpoint
from eclectus.server.remote.routing import RoutingParams, RoutingPolicy


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """``model``: the local model directory (or preset) whose tokenizer and chat template
    the engines must share. ``engine_urls``: each engine's OpenAI base (``.../v1``).
    ``builtin``: also run the built-in engine as one member of the pool.
    ``max_inflight_per_engine``: our requests on one engine at once.
    ``max_background_per_engine``: background (throughput) attempts one engine runs while
    latency work is in flight on it; those beyond are paused and continued later
    (preemption.py; None: no cap). ``read_timeout_s``: the
    longest wait for the next piece of a stream (a queued request waits for its first token
    too) before the engine counts as down. ``probe_interval_s``: how often down engines are
    re-probed and healthy ones' /metrics scraped. ``max_down_wait_s``: how long a request
    that finds no engine healthy waits for one to come back before failing with
    ``engine_unavailable`` (0: at once). ``max_model_len``: a cap on the context
    window (the engines' own is used otherwise). ``kv_events``: where each engine of
    ``engine_urls`` (same order) publishes its KV cache events (vLLM's
    ``--kv-events-config``), None for one that does not; empty: none does."""

    model: str
    engine_urls: tuple[str, ...] = ()
    builtin: bool = False
    routing: RoutingPolicy = RoutingPolicy.GRAPH
    routing_params: RoutingParams = field(default_factory=RoutingParams)
    max_inflight_per_engine: int = 256
    max_background_per_engine: int | None = 1
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    probe_interval_s: float = 2.0
    # A stream that fails probes its engine at once, so a live engine is back within one
    # handshake; this covers an engine that misses that probe too (a proxy restarting, a
    # brief network cut): three rounds of the prober at the default interval, far below
    # --engine-timeout, and short enough that a dead engine's requests still fail soon.
    max_down_wait_s: float = 6.0
    max_model_len: int | None = None
    kv_events: tuple[KVEventsEndpoint | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.engine_urls and not self.builtin:
            raise ValueError("a remote pool needs at least one --engine-url")
        for url in self.engine_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--engine-url {url!r}: must start with http:// or https://")
        if len({u.rstrip("/") for u in self.engine_urls}) != len(self.engine_urls):
            raise ValueError("--engine-url: the same URL is given twice")
        if self.kv_events and len(self.kv_events) != len(self.engine_urls):
            raise ValueError(
                f"--engine-kv-events: given {len(self.kv_events)} times for "
                f"{len(self.engine_urls)} --engine-url; give one per engine, in the same "
                "order ('none' for an engine without events)"
            )
        for name in ("max_inflight_per_engine",):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_background_per_engine is not None and self.max_background_per_engine < 0:
            raise ValueError("max_background_per_engine must be >= 0 (None: no cap)")
        for name in ("connect_timeout_s", "read_timeout_s", "probe_interval_s"):
            require_range(name, getattr(self, name), 0, inclusive=False)
        require_range("max_down_wait_s", self.max_down_wait_s, 0, inclusive=True)
