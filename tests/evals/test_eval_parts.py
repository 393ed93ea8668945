"""Unit tests of the eval harness's parts: fresh input, workloads, critical chains, summary."""

from __future__ import annotations

import pytest

from eclectus.evals.critical_path import critical_chain, stand_in
from eclectus.evals.fresh import fresh_text
from eclectus.evals.harness import BoundRecord, RunRecord
from eclectus.evals.summary import summarize
from eclectus.evals.workloads import (
    full_workloads,
    quick_workloads,
    replace_path,
    workload,
)
from eclectus.recipes import (
    ChainSummaryParams,
    MapReduceParams,
    MultiAgentParams,
    PlanExecuteParams,
    SharedPromptParams,
)
from eclectus.recipes.map_reduce import planned_calls
from eclectus.recipes.text import load_sample, split_chunks

SAMPLE = load_sample("field-guide")


def test_fresh_text_keeps_layout_and_chunk_cuts() -> None:
    """A fresh document has the same length and non-letters, and is cut at the same places."""
    fresh = fresh_text(SAMPLE, 7)
    assert len(fresh) == len(SAMPLE) and fresh != SAMPLE
    assert [c for c in fresh if not c.isalpha()] == [c for c in SAMPLE if not c.isalpha()]
    lengths = [len(c) for c in split_chunks(SAMPLE, 512, 6)]
    assert [len(c) for c in split_chunks(fresh, 512, 6)] == lengths


def test_fresh_texts_differ_from_the_first_letter() -> None:
    """Runs never share a chunk's opening, so no run hits another run's prefix cache."""
    openings = {
        tuple(c[:16] for c in split_chunks(fresh_text(SAMPLE, s), 256, 8)) for s in range(20)
    }
    assert len(openings) == 20


def test_workload_overrides_and_sweeps() -> None:
    """--set changes a (nested) base field; --sweep replaces the sweeps with typed values."""
    chosen = workload(
        "mixed", True, {"background.num_chunks": "2", "requests": "3"}, {"rate": "1,2.5"}
    )
    assert chosen.base.background.num_chunks == 2 and chosen.base.requests == 3
    assert chosen.sweeps[0].field == "rate" and chosen.sweeps[0].values == (1.0, 2.5)
    assert chosen.description == full_workloads()["mixed"].description


def test_quick_workloads_are_the_full_ones_smaller() -> None:
    """--quick keeps each workload's recipe, metric and description; only sizes shrink."""
    full, quick = full_workloads(), quick_workloads()
    assert list(quick) == list(full)
    for name, small in quick.items():
        big = full[name]
        assert (small.recipe, small.metric, small.description) == (
            big.recipe,
            big.metric,
            big.description,
        )
        assert small.base != big.base and len(small.sweeps) == 1
        assert len(small.sweeps[0].values) == 2


def test_workload_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        workload("nope", True, {}, {})
    with pytest.raises(ValueError, match="no field"):
        replace_path(MapReduceParams(), "chunks", 3)


def test_workload_values_follow_the_declared_type() -> None:
    """--set/--sweep parse by the field's type (as `eclectus run --param` does) and refuse a
    value of the wrong type, or one the params reject, naming the workload and the field."""
    chosen = workload("map-reduce", True, {"num_chunks": "none"}, {"map_tokens": "4,8"})
    assert chosen.base.num_chunks is None and chosen.sweeps[0].values == (4, 8)
    with pytest.raises(ValueError, match=r"workload map-reduce: .*chunk_tokens expects int"):
        workload("map-reduce", True, {"chunk_tokens": "1.5"}, {})
    with pytest.raises(ValueError, match=r"workload shared-prompt: .*background is None"):
        workload("shared-prompt", True, {}, {"background.width": "2"})
    with pytest.raises(ValueError, match="map_tokens"):
        workload("map-reduce", True, {}, {"map_tokens": "4,0"})


def test_map_reduce_chain_has_the_recipe_depth() -> None:
    """One map, each collapse level, the reduce: the recipe's own dependency depth."""
    params = MapReduceParams(chunk_tokens=128, num_chunks=12, map_tokens=40, context_tokens=200)
    calls = critical_chain("map-reduce", params, SAMPLE)
    assert len(calls) == planned_calls(params, 12)[1]
    assert calls[-1].max_tokens == params.reduce_tokens and calls[0].prompt is not None


def test_chain_summary_and_multi_agent_chains() -> None:
    """Every refine step; architect, list, draft and two calls per round, as chat."""
    assert len(critical_chain("chain-summary", ChainSummaryParams(128, 5, 20), SAMPLE)) == 5
    agent = critical_chain("multi-agent", MultiAgentParams(files=3, rounds=2), SAMPLE)
    assert len(agent) == 3 + 2 * 2
    assert agent[0].messages is not None and agent[0].messages[0]["role"] == "system"
    assert len(stand_in(37)) == 37


def test_shared_prompt_chain_times_one_warm_chat() -> None:
    """An untimed chat puts the shared system prompt in the cache; one chat is timed."""
    calls = critical_chain("shared-prompt", SharedPromptParams(requests=1, background=None), SAMPLE)
    assert [c.prime for c in calls] == [True, False]
    assert calls[0].messages[0] == calls[1].messages[0]  # type: ignore[index]
    assert calls[0].messages[1] != calls[1].messages[1]  # type: ignore[index]


def test_plan_execute_chain_is_plan_one_step_answer() -> None:
    """The plan, one step, then the answer over every step's result; the LangGraph team
    makes the multi-agent recipe's calls."""
    params = PlanExecuteParams(steps=5, goal_tokens=64, plan_tokens=16, step_tokens=10)
    plan, step, answer = critical_chain("plan-execute", params, SAMPLE)
    assert [c.max_tokens for c in (plan, step, answer)] == [16, 10, params.answer_tokens]
    assert answer.messages is not None
    assert answer.messages[1]["content"].count(stand_in(10)) == 5
    team = MultiAgentParams(files=3, rounds=1)
    assert critical_chain("multi-agent-graph", team, SAMPLE) == critical_chain(
        "multi-agent", team, SAMPLE
    )


def test_rtt_sweeps_take_milliseconds_on_any_workload() -> None:
    """`--sweep rtt_ms=0,100` varies the round trip, not a recipe field, on every workload;
    a bad value names the field."""
    for name in ("map-reduce", "mixed", "plan-execute"):
        (sweep,) = workload(name, True, {}, {"rtt_ms": "0,100,250"}).sweeps
        assert (sweep.field, sweep.values) == ("rtt_ms", (0.0, 100.0, 250.0))
    for bad in ("-5", "fast"):
        with pytest.raises(ValueError, match="workload map-reduce: rtt_ms"):
            workload("map-reduce", True, {}, {"rtt_ms": f"0,{bad}"})
    for name in ("plan-execute", "multi-agent-graph"):
        assert full_workloads()[name].sweeps[0].values == (0.0, 100.0, 250.0)


def _run(
    system: str,
    rep: int,
    metric: float,
    round_trips: int | None = None,
    latencies: dict[str, float] | None = None,
    background: dict[str, float] | None = None,
    output: str = "",
) -> RunRecord:
    return RunRecord(
        "w",
        "x",
        1,
        system,
        rep,
        metric,
        metric,
        3,
        2,
        100.0,
        25.0,
        round_trips=round_trips,
        latencies=latencies or {},
        background=background or {},
        output=output,
    )


def test_summary_counts_outputs_equal_to_the_stock_runs() -> None:
    """Each run's output is compared with the stock system's of the same round (the same
    input): vLLM's when it ran; the warm-up does not count; the stock system itself has
    no count, and with no stock system nobody has one."""
    runs = [
        _run("vllm", -1, 1.0, output="warm"),
        *(_run("vllm", i, 1.0, output=f"out{i}") for i in range(3)),
        *(_run("self", i, 1.0, output=f"out{i}") for i in range(3)),
        *(_run("eclectus", i, 1.0, output="out0" if i == 0 else "other") for i in range(3)),
    ]
    rows = {row.system: row for row in summarize(runs, [], {}, "eclectus")}
    assert (rows["vllm"].num_equal_outputs, rows["vllm"].num_compared) == (None, 0)
    assert (rows["self"].num_equal_outputs, rows["self"].num_compared) == (3, 3)
    assert (rows["eclectus"].num_equal_outputs, rows["eclectus"].num_compared) == (1, 3)
    alone = summarize([_run("eclectus", 0, 1.0, output="x")], [], {}, "eclectus")
    assert (alone[0].num_equal_outputs, alone[0].num_compared) == (None, 0)


def test_summary_prefilled_tokens_round_trips_and_latencies() -> None:
    """Prefilled = prompt - cached; round trips, each latency and each background detail
    are medians."""
    runs = [
        _run("eclectus", i, 1.0, 2, {"chat p50 latency s": v}, {"analytics jobs done": 10 - v})
        for i, v in enumerate([1, 3, 2])
    ]
    (row,) = summarize(runs, [], {}, "eclectus")
    assert row.prefilled_tokens == 75 and row.round_trips == 2
    assert row.latencies == {"chat p50 latency s": 2}
    assert row.background == {"analytics jobs done": 8}


def test_summary_medians_ratios_and_bounds() -> None:
    """Warm-ups are excluded; ratios are over the reference's median and the engine's bound."""
    runs = [
        _run("eclectus", -1, 9.0),
        *(_run("eclectus", i, v) for i, v in enumerate([1, 2, 3])),
        *(_run("self", i, v) for i, v in enumerate([4, 5, 6])),
    ]
    bounds = [BoundRecord("w", "x", 1, "engine", 0.5, [0.5], 2)]
    rows = summarize(runs, bounds, {"eclectus": "engine", "self": "engine"}, "eclectus")
    ours, theirs = rows
    assert (ours.median, ours.low, ours.high, ours.num_runs) == (2, 1, 3, 3)
    assert theirs.vs_reference == pytest.approx(2.5) and theirs.vs_bound == pytest.approx(10)
    assert ours.cache_hit_ratio == pytest.approx(0.25)


def test_scoped_flags_apply_to_their_workload_only() -> None:
    """`--sweep map-reduce:FIELD=...` reaches map-reduce, not chain-summary; unscoped: both."""
    from eclectus.evals.cli import _pairs

    entries = ["map-reduce:map_tokens=25,100", "num_chunks=4"]
    assert _pairs(entries, "--sweep", "map-reduce") == {"map_tokens": "25,100", "num_chunks": "4"}
    assert _pairs(entries, "--sweep", "chain-summary") == {"num_chunks": "4"}
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        _pairs(["map_tokens"], "--set", "map-reduce")
