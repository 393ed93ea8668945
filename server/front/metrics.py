"""Server counters and their Prometheus page (GET /metrics), rendered by prometheus-client.

Counters are plain ints bumped on the event loop thread by their owners, so no locks and no
global registry (tests run many servers in one process). A scrape builds a
:class:`Scrape` of the figures read at that moment (engine stats, scheduler and connection
gauges, sessions per tenant) and renders everything through a one-shot collector.
Nothing here is per prompt: the page says how much work the server did, never what any
tenant asked.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from eclectus.server.backend import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds; from a cached tiny-model call on a CPU to a long generation on a busy GPU.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


@dataclass(slots=True)
class Histogram:
    """Cumulative-bucket histogram in the Prometheus sense."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        """Record one value (mutates)."""
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(upper bound, cumulative count) pairs, ``+Inf`` last (pure)."""
        pairs, running = [], 0
        for bound, num in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += num
            pairs.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return pairs


@dataclass(frozen=True, slots=True)
class Scrape:
    """What a scrape reads from the rest of the server at that moment."""

    engine: EngineStats
    gauges: dict[str, float]  # name (without the eclectus_ prefix) -> value
    counters: dict[str, float]  # name (without the eclectus_ prefix and _total) -> value
    sessions_per_tenant: dict[str, int]  # tenant label ("none": auth off) -> open sessions


@dataclass(slots=True)
class Metrics:
    """Every counter the server exports. Fields are mutated directly by their owners:
    session.py (sessions, frames, values, errors, rejections, timeouts, get latency),
    runner.py (calls submitted and finished), scheduler.py (calls failed and cancelled, ops),
    the HTTP routes (responses by route and status)."""

    sessions: int = 0
    sessions_total: int = 0
    client_frames: int = 0
    values_sent: int = 0
    deltas_sent: int = 0
    errors_sent: int = 0
    calls_submitted: int = 0  # engine requests handed to the backend
    calls_finished: int = 0
    calls_failed: int = 0
    calls_cancelled: int = 0
    ops_run: int = 0
    get_latency: dict[str, Histogram] = field(default_factory=dict)
    rejected_frames: Counter[str] = field(default_factory=Counter)  # error code -> frames
    timeouts: Counter[str] = field(default_factory=Counter)  # "hello" | "idle" -> sessions
    http_responses: Counter[tuple[str, str]] = field(default_factory=Counter)  # route, status

    def observe_get(self, criteria: str, seconds: float) -> None:
        """Record the time from a get to its value (mutates)."""
        self.get_latency.setdefault(criteria, Histogram()).observe(seconds)

    def render(self, scrape: Scrape) -> str:
        """The Prometheus text page (pure)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self, scrape))
        return generate_latest(registry).decode()


class _Collector:
    """A one-shot prometheus-client collector over one Metrics and one Scrape."""

    def __init__(self, metrics: Metrics, scrape: Scrape) -> None:
        self.metrics = metrics
        self.scrape = scrape

    def collect(self) -> Iterator[Metric]:
        yield from self._server()
        yield from self._engine()
        yield from self._labelled()

    def _server(self) -> Iterator[Metric]:
        m = self.metrics
        yield GaugeMetricFamily("eclectus_sessions", "Open sessions.", m.sessions)
        for name, help_text, value in (
            ("sessions", "Sessions opened.", m.sessions_total),
            ("client_frames", "Frames received.", m.client_frames),
            ("values_sent", "Value frames sent.", m.values_sent),
            ("deltas_sent", "Delta frames sent.", m.deltas_sent),
            ("errors_sent", "Error frames sent.", m.errors_sent),
            ("calls_submitted", "Engine requests dispatched.", m.calls_submitted),
            ("calls_finished", "Engine requests finished.", m.calls_finished),
            ("calls_failed", "Engine requests failed.", m.calls_failed),
            ("calls_cancelled", "Engine requests cancelled.", m.calls_cancelled),
            ("ops_run", "Server-side ops run.", m.ops_run),
        ):
            yield CounterMetricFamily(f"eclectus_{name}", help_text, value)
        for name, value in self.scrape.gauges.items():
            help_text = f"Server {name.replace('_', ' ')}."
            yield GaugeMetricFamily(f"eclectus_{name}", help_text, value)
        for name, value in self.scrape.counters.items():
            help_text = f"Server {name.replace('_', ' ')}."
            yield CounterMetricFamily(f"eclectus_{name}", help_text, value)

    def _engine(self) -> Iterator[Metric]:
        e = self.scrape.engine
        for name, help_text, value in (
            ("engine_running", "Engine requests running.", e.num_running),
            ("engine_waiting", "Engine requests waiting.", e.num_waiting),
            ("engine_free_blocks", "Free KV blocks.", e.num_free_blocks),
            ("engine_total_blocks", "KV blocks.", e.num_total_blocks),
            ("engine_cached_blocks", "Cached KV blocks.", e.num_cached_blocks),
        ):
            yield GaugeMetricFamily(f"eclectus_{name}", help_text, value)
        for name, help_text, value in (
            ("prompt_tokens", "Prompt tokens requested.", e.prompt_tokens),
            ("prefill_tokens", "Prompt tokens computed.", e.prefill_tokens),
            (
                "prefix_cache_hit_tokens",
                "Prompt tokens served from the prefix cache.",
                e.cache_hit_tokens,
            ),
            ("generated_tokens", "Tokens generated.", e.generated_tokens),
            ("engine_preemptions", "Engine preemptions.", e.num_preemptions),
        ):
            yield CounterMetricFamily(f"eclectus_{name}", help_text, value)
        for key, value in sorted(e.extra.items()):  # a backend's own figures (remote, ...)
            yield GaugeMetricFamily(f"eclectus_engine_{_metric_name(key)}", f"Engine {key}.", value)

    def _labelled(self) -> Iterator[Metric]:
        m = self.metrics
        tenants = GaugeMetricFamily(
            "eclectus_tenant_sessions", "Open sessions per tenant.", labels=["tenant"]
        )
        for tenant, num in sorted(self.scrape.sessions_per_tenant.items()):
            tenants.add_metric([tenant], num)
        yield tenants
        rejected = CounterMetricFamily(
            "eclectus_rejected_frames", "Frames refused, by error code.", labels=["reason"]
        )
        for reason, num in sorted(m.rejected_frames.items()):
            rejected.add_metric([reason], num)
        yield rejected
        timeouts = CounterMetricFamily(
            "eclectus_session_timeouts", "Sessions closed by a deadline.", labels=["kind"]
        )
        for kind, num in sorted(m.timeouts.items()):
            timeouts.add_metric([kind], num)
        yield timeouts
        http = CounterMetricFamily(
            "eclectus_http_responses",
            "HTTP responses, by route and status.",
            labels=["route", "code"],
        )
        for (route, code), num in sorted(m.http_responses.items()):
            http.add_metric([route, code], num)
        yield http
        latency = HistogramMetricFamily(
            "eclectus_get_latency_seconds", "Time from a get to its value.", labels=["criteria"]
        )
        for criteria, histogram in sorted(m.get_latency.items()):
            latency.add_metric([criteria], histogram.cumulative(), histogram.total)
        yield latency


def _metric_name(key: str) -> str:
    """``key`` as a metric-name fragment: letters, digits and underscores (pure)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name (with labels) -> value, from a Prometheus text page (pure). For tests and
    the demo, which read the server's own numbers back."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
