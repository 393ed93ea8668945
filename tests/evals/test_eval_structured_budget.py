"""The tight-budget comparison's Eclectus half, end to end on a real server's /v1: every
output at the shortest budget parses and validates (what the comparison reports for vLLM is
its own count, taken in the evals)."""

from __future__ import annotations

from eclectus.evals.structured_budget import SLACKS, cases, measure, table
from eclectus.server.config import ServerConfig
from eclectus.server.engine import AsyncEngine
from eclectus.server.front.app import serve_in_thread


def guaranteed() -> AsyncEngine:
    """The engine as the comparison starts it: with the (opt-in) budget guarantee."""
    return AsyncEngine.from_config(model="tiny", budget_guarantee=True)


def test_eclectus_outputs_at_the_shortest_budget_all_validate() -> None:
    prompt, found = cases("tiny")
    assert {c.slack for c in found} == set(SLACKS)
    with serve_in_thread(ServerConfig(port=0, model="tiny"), guaranteed) as server:
        tallies = measure(server.openai_url, "tiny", prompt, found, samples=2)
    assert all(t.total == 2 * len(found) // len(SLACKS) for t in tallies.values())
    assert all(t.valid == t.total for t in tallies.values()), tallies
    assert "| shortest + 0 | 8/8 (100%) |" in table({"eclectus": tallies})
