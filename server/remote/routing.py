"""Which engine takes a request: a pure function of the pool's state.

Three policies (``eclectus serve --routing``):

``round-robin``   the next available engine after the previous choice (a baseline).
``least-loaded``  the available engine with the shortest queue (a baseline).
``graph``         (default) what sgl-router's cache-aware policy does, plus what only the
                  graph knows. In order, among available engines (healthy, below their
                  in-flight cap) that are not *overloaded* (queue longer than the shortest by
                  more than ``balance_abs`` and by a factor of more than ``balance_rel``):

  1. **pinned prefix**: the engine holding the longest prefix of this prompt that an earlier
     request pinned (``EngineRequest.pin_prefix_tokens``: the scheduler knows calls still
     queued need it), so a shared prefix is prefilled on one engine and its consumers follow;
  2. **group**: the engine running most of this request's task group (siblings the
     scheduler dispatched together for one consumer), so they batch together;
  3. **prefix**: the engine with the longest cached prefix, if it covers at least
     ``cache_threshold`` of the prompt (sgl-router's rule);
  4. **least loaded** otherwise.

An overloaded engine loses its affinity: load demands the split. Queue length is the larger
of our in-flight count and the engine's running + waiting (its ``/metrics``; other clients
count too); ties go to the lower KV usage, then the lower index.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RoutingPolicy(StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    GRAPH = "graph"


@dataclass(frozen=True, slots=True)
class RoutingParams:
    """The graph policy's thresholds (sgl-router's defaults for the last three)."""

    cache_threshold: float = 0.5
    balance_abs: int = 32
    balance_rel: float = 1.5


@dataclass(frozen=True, slots=True)
class EngineView:
    """One engine as the router sees it for one request."""

    index: int
    healthy: bool
    num_inflight: int  # our requests on it
    max_inflight: int
    num_running: int | None = None  # from its /metrics (all its clients)
    num_waiting: int | None = None
    kv_usage: float | None = None
    match_tokens: int = 0  # longest prefix of this prompt it holds
    pinned_match_tokens: int = 0  # longest prefix of this prompt pinned on it
    num_group_inflight: int = 0  # this request's group siblings in flight on it

    @property
    def available(self) -> bool:
        return self.healthy and self.num_inflight < self.max_inflight

    @property
    def queue_length(self) -> int:
        reported = (self.num_running or 0) + (self.num_waiting or 0)
        return max(self.num_inflight, reported)

    def load_key(self) -> tuple[int, float, int]:
        return (self.queue_length, self.kv_usage or 0.0, self.index)


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen engine's index and why (logged, counted in /metrics, asserted in tests)."""

    index: int
    reason: str  # "pinned-prefix", "group", "prefix", "least-loaded", "round-robin"


def route(
    policy: RoutingPolicy,
    engines: list[EngineView],
    num_prompt_tokens: int,
    *,
    last_index: int = -1,
    params: RoutingParams | None = None,
) -> Decision | None:
    """The engine for a request of ``num_prompt_tokens``, or None when none is available
    (pure). ``last_index``: round-robin's previous choice."""
    params = params or RoutingParams()
    available = [e for e in engines if e.available]
    if not available:
        return None
    if policy is RoutingPolicy.ROUND_ROBIN:
        after = [e for e in available if e.index > last_index]
        return Decision((after or available)[0].index, "round-robin")
    least = min(available, key=EngineView.load_key)
    if policy is RoutingPolicy.GRAPH:
        balanced = [e for e in available if not _overloaded(e, least, params)]
        affinity = _affinity(balanced, num_prompt_tokens, params)
        if affinity is not None:
            return affinity
    return Decision(least.index, "least-loaded")


def _affinity(
    engines: list[EngineView], num_prompt_tokens: int, params: RoutingParams
) -> Decision | None:
    """The graph policy's steps 1-3 over engines that are not overloaded (pure)."""
    pinned = max(engines, key=lambda e: (e.pinned_match_tokens, _neg_load(e)))
    if pinned.pinned_match_tokens > 0:
        return Decision(pinned.index, "pinned-prefix")
    grouped = max(engines, key=lambda e: (e.num_group_inflight, _neg_load(e)))
    if grouped.num_group_inflight > 0:
        return Decision(grouped.index, "group")
    cached = max(engines, key=lambda e: (e.match_tokens, _neg_load(e)))
    if cached.match_tokens > 0 and cached.match_tokens >= params.cache_threshold * max(
        num_prompt_tokens, 1
    ):
        return Decision(cached.index, "prefix")
    return None


def _neg_load(engine: EngineView) -> tuple[int, float, int]:
    queue, usage, index = engine.load_key()
    return (-queue, -usage, -index)


def _overloaded(engine: EngineView, least: EngineView, params: RoutingParams) -> bool:
    """sgl-router's imbalance rule: far longer queue than the least loaded, both in absolute
    and in relative terms (pure)."""
    gap = engine.queue_length - least.queue_length
    return gap > params.balance_abs and engine.queue_length > params.balance_rel * max(
        least.queue_length, 1
    )
