"""Each recipe end to end at a small size, in both modes, on one real embedded server:
Eclectus mode (ChatEclectus / EclectusLLM, compiled) and openai mode (langchain_openai over
the server's /v1 endpoint). Greedy decoding on the same engine gives the same output."""

from __future__ import annotations

from typing import Any

import pytest
from recipe_support import SMALL_TEAM, TEXT

from eclectus.models.presets import PRESET_NOTES
from eclectus.recipes import (
    ChainSummaryParams,
    MapReduceParams,
    RecipeResult,
    SharedPromptParams,
    run_recipe,
)
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.map_reduce import LIST_TAIL, REDUCE_HEAD, group_size
from eclectus.recipes.text import approx_tokens

pytestmark = pytest.mark.slow

CASES: dict[str, tuple[Any, int, int]] = {  # name -> (params, calls, depth)
    "map-reduce": (
        MapReduceParams(chunk_tokens=64, num_chunks=3, map_tokens=8, reduce_tokens=8),
        4,
        2,
    ),
    "chain-summary": (ChainSummaryParams(chunk_tokens=64, num_chunks=3, summary_tokens=8), 3, 3),
    "multi-agent": (
        SMALL_TEAM,
        2 + 2 * 3,
        5,
    ),
    "shared-prompt": (
        SharedPromptParams(
            users=2,
            requests=3,
            rate=50.0,
            system_tokens=128,
            answer_tokens=8,
            background=MapReduceParams(
                chunk_tokens=64, num_chunks=2, map_tokens=8, reduce_tokens=8
            ),
        ),
        3 + 3,
        2,
    ),
}


def run_both(embedded: Embedded, name: str) -> tuple[RecipeResult, RecipeResult]:
    params = CASES[name][0]
    ours = run_recipe(name, params, embedded.target("eclectus"), text=TEXT)
    stock = run_recipe(name, params, embedded.target("openai"), text=TEXT)
    return ours, stock


@pytest.mark.parametrize("name", list(CASES))
def test_both_modes_agree(embedded: Embedded, name: str) -> None:
    """Both modes make the planned calls, report the same depth, and (greedy, one engine)
    produce the same output."""
    _, calls, depth = CASES[name]
    ours, stock = run_both(embedded, name)
    assert ours.output == stock.output
    assert ours.output.strip()
    for result in (ours, stock):
        assert result.num_calls == calls, (result.backend, result.notes)
        assert result.depth == depth
        assert result.cache_hit_ratio is not None and 0.0 <= result.cache_hit_ratio <= 1.0
        assert result.wall_s > 0


def test_collapse_adds_levels(embedded: Embedded) -> None:
    """Summaries that do not fit one combine prompt are collapsed first: more calls, deeper."""
    room_for_two = approx_tokens(REDUCE_HEAD + LIST_TAIL) + 2 * (8 + 2) + 5
    params = MapReduceParams(
        chunk_tokens=64, num_chunks=5, map_tokens=8, reduce_tokens=8, context_tokens=room_for_two
    )
    assert group_size(params) == 2
    result = run_recipe("map-reduce", params, embedded.target("eclectus"), text=TEXT)
    assert (result.num_calls, result.depth) == (5 + 3 + 2 + 1, 4)  # 5 -> 3 -> 2 -> reduce


def test_shared_prefix_hits_the_cache(embedded: Embedded) -> None:
    """Chats sharing a long system prompt are mostly served from the prefix cache."""
    params = SharedPromptParams(
        users=4, requests=4, rate=100.0, system_tokens=512, answer_tokens=4, seed=7, background=None
    )
    result = run_recipe("shared-prompt", params, embedded.target("eclectus"), text=TEXT)
    assert result.cache_hit_ratio is not None and result.cache_hit_ratio > 0.5
    assert result.details["all answers"] == 4


def test_foreign_server_counts_on_the_client(embedded: Embedded) -> None:
    """Without a metrics URL (a foreign server), calls are counted by the callback handler
    and the cache hit ratio is unknown."""
    target = embedded.target("openai")
    foreign = type(target)("openai", target.url, target.model)
    params = ChainSummaryParams(chunk_tokens=64, num_chunks=2, summary_tokens=4)
    result = run_recipe("chain-summary", params, foreign, text=TEXT)
    assert result.num_calls == 2 and result.cache_hit_ratio is None
    assert len(result.timeline) == 2
    assert result.timeline[0].end_s <= result.timeline[1].start_s  # the refine is sequential


def test_cli_runs_a_recipe_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    """``eclectus run`` on the embedded server prints the report's numbers and output."""
    from eclectus.cli import main

    code = main(
        [
            "run",
            "chain-summary",
            "--chunk-tokens",
            "64",
            "--num-chunks",
            "2",
            "--output-tokens",
            "4",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    for label in (
        "wall time:",
        "model calls:            2",
        "graph depth:            2",
        "prefix-cache hit ratio:",
        PRESET_NOTES["tiny"],
        "output:",
    ):
        assert label in out


def test_analytics_runs_as_throughput_work(embedded: Embedded) -> None:
    """In Eclectus mode the chats ask for latency and the background job for throughput, so
    the scheduler can put the users first (a stock server cannot be told)."""
    histograms = embedded.server.metrics.get_latency

    def count(criteria: str) -> int:
        return histograms[criteria].count if criteria in histograms else 0

    before = count("throughput"), count("latency")
    run_recipe("shared-prompt", CASES["shared-prompt"][0], embedded.target("eclectus"), text=TEXT)
    assert count("throughput") > before[0]
    assert count("latency") > before[1]


def test_compiled_chain_summary_is_one_frame(embedded: Embedded) -> None:
    """The compiled refine chain is one graph: no fallback, one client frame for the whole
    run (submit + get), and all three steps dispatched by the server on that one frame, so
    step k+1 never waits for a client round trip."""
    params = CASES["chain-summary"][0]
    target = embedded.target("eclectus")
    run_recipe("chain-summary", params, target, text=TEXT)  # opens the client's session
    log = embedded.server.scheduler.dispatch_log
    mark = len(log)
    result = run_recipe("chain-summary", params, target, text=TEXT)
    assert result.notes == []
    counters = result.server_counters
    assert counters.get("eclectus_client_frames_total") == 1, counters
    assert counters.get("eclectus_calls_finished_total") == 3
    dispatched = list(log)[mark:]
    assert len(dispatched) == 3 and len({session for session, _ in dispatched}) == 1
