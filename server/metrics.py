"""Server counters and their Prometheus text rendering (GET /metrics).

Counters are plain ints bumped on the event loop thread, so no locks. Engine counters are read
from Backend.stats() when the page is rendered; the scheduler's gauges through a callback.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from eclectus.server.backend import EngineStats

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

    def render(self, name: str, labels: str) -> list[str]:
        lines, running = [], 0
        for bound, num in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += num
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


@dataclass(slots=True)
class Metrics:
    """Every counter the server exports. Fields are mutated directly by their owners:
    session.py (sessions, frames, values, errors, get latency), runner.py (calls submitted and
    finished), scheduler.py (calls failed and cancelled, ops)."""

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

    def observe_get(self, criteria: str, seconds: float) -> None:
        """Record the time from a get to its value (mutates)."""
        self.get_latency.setdefault(criteria, Histogram()).observe(seconds)

    def render(self, engine: EngineStats, gauges: Callable[[], dict[str, float]]) -> str:
        """The Prometheus text page (pure)."""
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"])

        metric("eclectus_sessions", "gauge", "Open sessions.", self.sessions)
        metric("eclectus_sessions_total", "counter", "Sessions opened.", self.sessions_total)
        metric("eclectus_client_frames_total", "counter", "Frames received.", self.client_frames)
        metric("eclectus_values_sent_total", "counter", "Value frames sent.", self.values_sent)
        metric("eclectus_deltas_sent_total", "counter", "Delta frames sent.", self.deltas_sent)
        metric("eclectus_errors_sent_total", "counter", "Error frames sent.", self.errors_sent)
        metric(
            "eclectus_calls_submitted_total",
            "counter",
            "Engine requests dispatched.",
            self.calls_submitted,
        )
        metric(
            "eclectus_calls_finished_total",
            "counter",
            "Engine requests finished.",
            self.calls_finished,
        )
        metric(
            "eclectus_calls_failed_total", "counter", "Engine requests failed.", self.calls_failed
        )
        metric(
            "eclectus_calls_cancelled_total",
            "counter",
            "Engine requests cancelled.",
            self.calls_cancelled,
        )
        metric("eclectus_ops_run_total", "counter", "Server-side ops run.", self.ops_run)
        for name, value in gauges().items():
            metric(f"eclectus_{name}", "gauge", f"Scheduler {name.replace('_', ' ')}.", value)
        metric("eclectus_engine_running", "gauge", "Engine requests running.", engine.num_running)
        metric("eclectus_engine_waiting", "gauge", "Engine requests waiting.", engine.num_waiting)
        metric("eclectus_engine_free_blocks", "gauge", "Free KV blocks.", engine.num_free_blocks)
        metric("eclectus_engine_total_blocks", "gauge", "KV blocks.", engine.num_total_blocks)
        metric(
            "eclectus_engine_cached_blocks", "gauge", "Cached KV blocks.", engine.num_cached_blocks
        )
        metric(
            "eclectus_prompt_tokens_total",
            "counter",
            "Prompt tokens requested.",
            engine.prompt_tokens,
        )
        metric(
            "eclectus_prefill_tokens_total",
            "counter",
            "Prompt tokens computed.",
            engine.prefill_tokens,
        )
        metric(
            "eclectus_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            engine.cache_hit_tokens,
        )
        metric(
            "eclectus_generated_tokens_total",
            "counter",
            "Tokens generated.",
            engine.generated_tokens,
        )
        metric(
            "eclectus_engine_preemptions_total",
            "counter",
            "Engine preemptions.",
            engine.num_preemptions,
        )
        name = "eclectus_get_latency_seconds"
        out += [f"# HELP {name} Time from a get to its value.", f"# TYPE {name} histogram"]
        for criteria, histogram in sorted(self.get_latency.items()):
            out.extend(histogram.render(name, f'criteria="{criteria}"'))
        return "\n".join(out) + "\n"


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name (with labels) -> value, from a Prometheus text page (pure). For tests and
    the demo, which read the server's own numbers back."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
