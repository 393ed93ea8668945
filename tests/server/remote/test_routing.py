"""The routing policy is a pure function of the pool's state: each rule, and properties that
hold for any pool (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eclectus.server.front.prompt import Prompt
from eclectus.server.remote.prefix_index import PrefixIndex, prefix_keys
from eclectus.server.remote.routing import (
    EngineView,
    RoutingParams,
    RoutingPolicy,
    route,
)

GRAPH, LEAST, RR = RoutingPolicy.GRAPH, RoutingPolicy.LEAST_LOADED, RoutingPolicy.ROUND_ROBIN


def view(index: int, **fields: object) -> EngineView:
    base: dict[str, object] = {"healthy": True, "num_inflight": 0, "max_inflight": 8}
    return EngineView(index=index, **(base | fields))  # type: ignore[arg-type]


def test_round_robin_cycles_over_available_engines() -> None:
    """After engine i comes the next available one; down or full engines are skipped."""
    engines = [view(0), view(1, healthy=False), view(2), view(3, num_inflight=8)]
    picks, last = [], -1
    for _ in range(4):
        decision = route(RR, engines, 10, last_index=last)
        assert decision is not None
        picks.append(last := decision.index)
    assert picks == [0, 2, 0, 2]


def test_least_loaded_counts_what_the_engine_reports() -> None:
    """Queue length is the larger of our in-flight count and the engine's running+waiting
    (other clients load it too); ties go to the lower KV usage."""
    engines = [
        view(0, num_inflight=2),
        view(1, num_inflight=0, num_running=3, num_waiting=2),
        view(2, num_inflight=2, kv_usage=0.1),
        view(3, num_inflight=2, kv_usage=0.9),
    ]
    decision = route(LEAST, engines, 10)
    assert decision is not None and (decision.index, decision.reason) == (0, "least-loaded")
    assert route(LEAST, engines[1:], 10).index == 2  # type: ignore[union-attr]


def test_graph_prefers_pinned_prefix_then_group_then_cache() -> None:
    """A pinned prefix (consumers the graph knows are coming) beats a group, which beats
    a merely cached prefix, which beats load."""
    engines = [
        view(0),
        view(1, num_inflight=3, match_tokens=90),
        view(2, num_inflight=3, num_group_inflight=2),
        view(3, num_inflight=3, pinned_match_tokens=40, match_tokens=40),
    ]
    assert route(GRAPH, engines, 100) == route(GRAPH, engines[::-1], 100)
    assert route(GRAPH, engines, 100).reason == "pinned-prefix"  # type: ignore[union-attr]
    assert route(GRAPH, engines[:3], 100).index == 2  # type: ignore[union-attr]
    assert route(GRAPH, engines[:2], 100).reason == "prefix"  # type: ignore[union-attr]
    # a cached prefix under the threshold does not pull the request off the idle engine
    assert route(GRAPH, engines[:2], 200).index == 0  # type: ignore[union-attr]


def test_graph_splits_when_the_affine_engine_is_overloaded() -> None:
    """Affinity yields when the engine's queue is far longer than the shortest (absolute and
    relative thresholds), and holds below them."""
    params = RoutingParams(balance_abs=4, balance_rel=1.5)
    busy = view(1, num_inflight=6, num_group_inflight=6)
    assert route(GRAPH, [view(0), busy], 10, params=params).index == 0  # type: ignore[union-attr]
    close = view(1, num_inflight=4, num_group_inflight=4)
    assert route(GRAPH, [view(0), close], 10, params=params).index == 1  # type: ignore[union-attr]


def test_nothing_available_is_none() -> None:
    engines = [view(0, healthy=False), view(1, num_inflight=8, max_inflight=8)]
    for policy in RoutingPolicy:
        assert route(policy, engines, 10) is None


views = st.builds(
    lambda i, healthy, inflight, cap, running, waiting, match, pinned, group: EngineView(
        i, healthy, min(inflight, cap), cap, running, waiting, None, match, pinned, group
    ),
    st.just(0),
    st.booleans(),
    st.integers(0, 40),
    st.integers(1, 40),
    st.none() | st.integers(0, 80),
    st.none() | st.integers(0, 80),
    st.integers(0, 200),
    st.integers(0, 200),
    st.integers(0, 5),
)


@given(
    st.lists(views, min_size=1, max_size=6),
    st.sampled_from(list(RoutingPolicy)),
    st.integers(1, 200),
    st.integers(-1, 6),
)
def test_any_pool_routes_to_an_available_engine(
    engines: list[EngineView], policy: RoutingPolicy, num_tokens: int, last: int
) -> None:
    """Whatever the state: a decision names an available engine, there is one whenever any
    engine is available, and the graph policy never picks an overloaded engine."""
    engines = [EngineView(i, *vars_of(e)[1:]) for i, e in enumerate(engines)]
    decision = route(policy, engines, num_tokens, last_index=last)
    available = [e for e in engines if e.available]
    assert (decision is None) == (not available)
    if decision is None:
        return
    chosen = engines[decision.index]
    assert chosen.available
    if policy is GRAPH:
        params = RoutingParams()
        shortest = min(e.queue_length for e in available)
        gap = chosen.queue_length - shortest
        assert gap <= params.balance_abs or chosen.queue_length <= params.balance_rel * max(
            shortest, 1
        )


def vars_of(e: EngineView) -> tuple[object, ...]:
    return (
        e.index,
        e.healthy,
        e.num_inflight,
        e.max_inflight,
        e.num_running,
        e.num_waiting,
        e.kv_usage,
        e.match_tokens,
        e.pinned_match_tokens,
        e.num_group_inflight,
    )


def test_prefix_index_matches_at_seams_per_tenant() -> None:
    """The longest held prefix ends at a seam; another tenant's prefix never
    matches (its cache_salt keeps its KV apart); the index forgets least recently used."""
    shared = Prompt((1, 2, 3, 4, 5, 6), (3, 6))
    other = Prompt((1, 2, 3, 9, 9), (3, 5))
    index = PrefixIndex(max_entries=2)
    index.insert(prefix_keys(shared, "a"))
    assert index.match(prefix_keys(shared, "a")) == 6
    assert index.match(prefix_keys(other, "a")) == 3
    assert index.match(prefix_keys(other, "b")) == 0
    index.insert(prefix_keys(Prompt((7, 8), (1, 2)), "a"))  # evicts both of shared
    assert index.match(prefix_keys(shared, "a")) == 0
