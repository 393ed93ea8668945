"""What a compiled recipe run costs over a slow client network, counted at the real
:class:`DelayProxy` the evals use: one client turn per real client decision (a cut), a
WebSocket session's setup (upgrade, ``hello``) once per application and process, never per
run; and time at RTT ``r`` minus time at RTT 0 within (turns + 0.5) x ``r``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from recipe_support import SMALL_TEAM, TEXT

from eclectus.evals.proxy import DelayProxy, Traffic
from eclectus.recipes import ChainSummaryParams, MapReduceParams, run_recipe
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.target import Target

pytestmark = pytest.mark.slow

# name -> (params, client turns per run, applications (sessions) it opens)
CASES: dict[str, tuple[Any, int, int]] = {
    # the architect's graph, then the team's (one application, one session): the file list
    # is read by Python in between
    "multi-agent": (SMALL_TEAM, 2, 1),
    # the same team as a LangGraph app: one cut at the router (Send per file)
    "multi-agent-graph": (SMALL_TEAM, 2, 1),
    # the team with a JSON file list: the whole app is one server graph (a map of pipelines)
    "multi-agent-json": (SMALL_TEAM, 1, 1),
    "map-reduce": (
        MapReduceParams(chunk_tokens=64, num_chunks=3, map_tokens=8, reduce_tokens=8),
        1,
        1,
    ),
    "chain-summary": (ChainSummaryParams(chunk_tokens=64, num_chunks=3, summary_tokens=8), 1, 1),
}
SESSION_SETUP_TURNS = 1  # the WebSocket upgrade, which carries the hello


def _proxied(embedded: Embedded, proxy: DelayProxy) -> Target:
    return Target("eclectus", f"ws://127.0.0.1:{proxy.port}", embedded.model, embedded.metrics_url)


def _counted(name: str, params: Any, target: Target, proxy: DelayProxy) -> tuple[float, Traffic]:
    before = proxy.traffic()
    result = run_recipe(name, params, target, text=TEXT)
    return result.wall_s, proxy.traffic() - before


@pytest.fixture
def proxy(embedded: Embedded) -> Iterator[DelayProxy]:
    host, port = embedded.server.url.removeprefix("ws://").rsplit(":", 1)
    with DelayProxy(host, int(port), rtt_s=0.05) as proxy:
        yield proxy


@pytest.mark.parametrize("name", list(CASES))
def test_a_compiled_run_crosses_the_proxy_once_per_client_decision(
    name: str, embedded: Embedded, proxy: DelayProxy
) -> None:
    """The first run opens one session per application (2 turns each); every later run
    reuses them and sends one frame per client decision, each after the previous reply."""
    params, turns, apps = CASES[name]
    target = _proxied(embedded, proxy)
    _, first = _counted(name, params, target, proxy)
    assert first.connections == apps
    assert first.turns == turns + SESSION_SETUP_TURNS * apps
    for _ in range(2):
        _, later = _counted(name, params, target, proxy)
        assert (later.connections, later.turns) == (0, turns)
        assert later.chunks_up == turns  # one frame per turn: nothing else went up


def test_a_compiled_multi_agent_pays_its_round_trips_and_no_more(embedded: Embedded) -> None:
    """Time at RTT 500 ms minus time at RTT 0 is at most (turns + 0.5) x RTT: two round
    trips (architect, team) and nothing waiting on a timer or an extra exchange. Fastest
    of three warm runs each, direct and delayed runs alternating, so a busy machine's noise
    mostly cancels."""
    rtt, (params, turns, _) = 0.5, CASES["multi-agent"]
    host, port = embedded.server.url.removeprefix("ws://").rsplit(":", 1)
    direct = embedded.target("eclectus")
    with DelayProxy(host, int(port), rtt_s=rtt) as proxy:
        delayed = _proxied(embedded, proxy)
        for target in (direct, delayed):  # sessions opened: not timed
            run_recipe("multi-agent", params, target, text=TEXT)
        at_zero, at_rtt = [], []
        for _ in range(3):
            at_zero.append(run_recipe("multi-agent", params, direct, text=TEXT).wall_s)
            at_rtt.append(_counted("multi-agent", params, delayed, proxy))
    assert [t.turns for _, t in at_rtt] == [turns] * 3
    extra = min(wall for wall, _ in at_rtt) - min(at_zero)
    assert (turns - 0.5) * rtt <= extra <= (turns + 0.5) * rtt, (
        f"{extra:.3f} s more at RTT {rtt} s: {at_zero} vs {[w for w, _ in at_rtt]}"
    )
