"""``eclectus eval load``: its parts (the schedule, the mix, the statistics) and its quick
mode end to end against a real Eclectus server, checking the report's shape, not speed."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eclectus.evals.budget import Budget
from eclectus.evals.load.cli import _plan, add_arguments
from eclectus.evals.load.driver import ProgramRecord
from eclectus.evals.load.mix import (
    DEFAULT_MIX,
    PROGRAM_TYPES,
    Sizes,
    burst,
    parse_mix,
    schedule,
    shape_range,
    unloaded_schedule,
)
from eclectus.evals.load.report import _capacity_table
from eclectus.evals.load.stats import (
    Drain,
    EngineTime,
    PointSummary,
    SloCrossing,
    Spread,
    drain,
    max_rate_meeting_slo,
    percentile,
    slo_crossing,
    summarize_round,
    unloaded_latencies,
)
from eclectus.evals.load.systems import SYSTEMS, LoadPlan
from eclectus.evals.servers import EclectusRemoteProcess, VllmProcess


@given(
    rate=st.floats(0.5, 50),
    duration=st.floats(0.5, 20),
    seed=st.integers(0, 2**30),
)
def test_a_schedule_is_poisson_shaped_and_seeded(rate: float, duration: float, seed: int) -> None:
    """Arrivals increase within the window, every type is the mix's and every shape in its
    range; the same seed gives the same schedule."""
    sizes = Sizes()
    specs = schedule(rate, duration, parse_mix(None), sizes, seed)
    assert specs == schedule(rate, duration, parse_mix(None), sizes, seed)
    arrivals = [s.arrival_s for s in specs]
    assert arrivals == sorted(arrivals) and all(0 < a < duration for a in arrivals)
    for spec in specs:
        low, high = shape_range(spec.kind, sizes)
        assert spec.kind in DEFAULT_MIX and low <= spec.shape <= high
    assert [s.index for s in specs] == list(range(len(specs)))


def test_the_mean_rate_is_the_rate() -> None:
    specs = schedule(10.0, 200.0, parse_mix(None), Sizes(), 7)
    assert 1900 < len(specs) < 2100


def test_unloaded_runs_cover_every_type_and_shape() -> None:
    sizes = Sizes()
    specs = unloaded_schedule(parse_mix(None), sizes, 2, 0)
    shapes = {(s.kind, s.shape) for s in specs}
    expected = {
        (k, n)
        for k in PROGRAM_TYPES
        for n in range(shape_range(k, sizes)[0], shape_range(k, sizes)[1] + 1)
    }
    assert shapes == expected and len(specs) == 2 * len(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("chat=1,dance=2", "TYPE=WEIGHT with TYPE one of"),
        ("chat=x", "not a number"),
        ("chat=-1", ">= 0"),
        ("chat=0", "at least one type"),
    ],
)
def test_a_bad_mix_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mix(text)


def test_a_mix_is_normalised() -> None:
    assert parse_mix("chat=3,map-reduce=1") == {"chat": 0.75, "map-reduce": 0.25}


def record(
    kind: str, latency: float | None, shape: int = 0, error: str | None = None
) -> ProgramRecord:
    end = None if latency is None else 1.0 + latency
    return ProgramRecord(0, kind, shape, 1.0, 1.0, end if error is None else None, None, error)


def test_percentiles_count_unfinished_programs_as_infinitely_late() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([1.0, math.inf], 0.95) == math.inf


def test_a_round_counts_goodput_failures_and_the_slo() -> None:
    unloaded = {("chat", 0): 0.1, ("map-reduce", 4): 1.0}
    records = [
        record("chat", 0.2),  # 2x: within a 5x SLO
        record("chat", 0.6),  # 6x: missed
        record("map-reduce", 4.0, shape=4),  # 4x: within
        record("map-reduce", None, shape=4),  # unfinished
        record("chat", None, error="boom"),  # failed
    ]
    summary = summarize_round(records, unloaded, 5.0, window_s=2.0, num_preemptions=3)
    assert summary.completed_per_s == 1.5 and summary.goodput_per_s == 1.0
    assert summary.within_slo == 0.4
    assert (summary.num_failed, summary.num_unfinished, summary.num_preemptions) == (1, 1, 3)
    assert summary.types["chat"].p95_slowdown == math.inf
    assert not PointSummary([summary]).meets_slo(5.0)


def test_where_vllms_time_went_is_read_from_its_histograms_around_a_run() -> None:
    """Two readings of vLLM's sums and counts (two engines summed): the mean inter-token
    latency and queue time of what ran between them, the mean number decoding per engine;
    a round carries them, and the report shows the inter-token latency against the
    unloaded one."""
    from eclectus.evals.load.report import _engine_table
    from eclectus.evals.load.stats import ENGINE_TIMES
    from eclectus.evals.load.sweep import LoadSweep

    itl_sum, itl_count, queue_sum, queue_count = ENGINE_TIMES
    before = {itl_sum: 4.0, itl_count: 100, queue_sum: 0.5, queue_count: 10}
    after = {itl_sum: 84.0, itl_count: 2100, queue_sum: 2.5, queue_count: 20}
    times = EngineTime.between(before, after, wall_s=10.0, engines=2)
    assert times == EngineTime(itl_s=0.04, queue_s=0.2, decoding=4.0)
    idle = EngineTime.between(before, before, wall_s=10.0, engines=1)
    assert (idle.itl_s, idle.queue_s, idle.decoding) == (None, None, 0.0)
    unloaded = {("chat", 0): 0.1}
    summary = summarize_round([record("chat", 0.2)], unloaded, 5.0, 1.0, 0, times)
    assert summary.engine == times
    assert PointSummary([summary]).engine_spread("decoding") == Spread(4.0, 4.0, 4.0)
    sweep = LoadSweep([], {"chat": 1.0}, Sizes.quick(), (1.0,), 1.0, 1, 1.0)
    sweep.unloaded_engine = EngineTime(itl_s=0.01, queue_s=0.0, decoding=1.0)
    table = _engine_table(sweep, {"vllm": {1.0: PointSummary([summary])}})
    assert "| vllm | 1 | 40.0 | 4.0 | 4.0 | 200 |" in table
    builtin = summarize_round([record("chat", 0.2)], unloaded, 5.0, 1.0)  # no histograms
    assert _engine_table(sweep, {"eclectus": {1.0: PointSummary([builtin])}}) == []


def test_the_highest_rate_meeting_the_slo_stops_at_the_first_miss() -> None:
    unloaded = {("chat", 0): 0.1}

    def point(latency: float) -> PointSummary:
        return PointSummary([summarize_round([record("chat", latency)], unloaded, 5.0, 1.0)])

    points = {1.0: point(0.2), 2.0: point(0.3), 4.0: point(0.9), 8.0: point(0.2)}
    assert max_rate_meeting_slo(points, 5.0) == 2.0
    assert max_rate_meeting_slo({1.0: point(0.9)}, 5.0) is None


def test_the_slo_crossing_is_interpolated_between_the_last_rate_meeting_it_and_the_next() -> None:
    unloaded = {("chat", 0): 0.1, ("map-reduce", 4): 1.0}

    def point(chat: float | None, reduce: float = 1.0) -> PointSummary:
        records = [record("chat", chat), record("map-reduce", reduce, shape=4)]
        return PointSummary([summarize_round(records, unloaded, 5.0, 1.0)])

    # the worst type decides: 3x (chat) at 2/s, 9x (map-reduce) at 4/s: 5x a third of the way
    points = {1.0: point(0.2), 2.0: point(0.3), 4.0: point(0.2, reduce=9.0)}
    assert points[4.0].worst_slowdown() == pytest.approx(9.0)
    crossing = slo_crossing(points, 5.0)
    assert crossing is not None and crossing.interpolated
    assert crossing.rate == pytest.approx(2.0 + (5 - 3) / (9 - 3) * 2.0)
    assert slo_crossing({1.0: point(0.2), 2.0: point(0.3)}, 5.0) == (2.0, False)  # no rate past
    unfinished = {1.0: point(0.2), 2.0: point(None)}  # a program still running: no slope
    assert slo_crossing(unfinished, 5.0) == (1.0, False)
    assert slo_crossing({1.0: point(0.9)}, 5.0) is None


def test_a_burst_arrives_at_once_drawn_by_the_mix_and_seeded() -> None:
    specs = burst(200, DEFAULT_MIX, Sizes(), seed=5)
    assert len(specs) == 200 and {s.arrival_s for s in specs} == {0.0}
    assert [s.index for s in specs] == list(range(200))
    assert {s.kind for s in specs} == set(DEFAULT_MIX)
    for spec in specs:
        low, high = shape_range(spec.kind, Sizes())
        assert low <= spec.shape <= high
    assert burst(200, DEFAULT_MIX, Sizes(), seed=5) == specs
    assert burst(200, DEFAULT_MIX, Sizes(), seed=6) != specs
    with pytest.raises(ValueError, match="at least one program"):
        burst(0, DEFAULT_MIX, Sizes(), seed=5)


def test_a_drain_counts_to_the_last_end_or_to_the_timeout() -> None:
    done = [record("chat", 2.0), record("chat", 4.0), record("chat", 1.0)]  # arrived at 1.0
    assert drain(done, wall_s=9.0, num_preemptions=2) == Drain(3, 3, 3 / 5.0, 2)
    cut = [*done, record("chat", None)]  # one still running at the drain timeout
    assert drain(cut, wall_s=10.0, num_preemptions=None) == Drain(4, 3, 0.3, None)


def test_the_capacity_table_sets_each_drain_against_the_references_crossing() -> None:
    drains = {
        "vllm": [Drain(10, 10, 3.0, 5), Drain(10, 10, 4.0, 7), Drain(10, 10, 3.5, 6)],
        "front": [Drain(10, 10, 4.0, 0), Drain(10, 10, 5.0, 0), Drain(10, 10, 4.5, 0)],
    }
    table = "\n".join(_capacity_table(drains, SloCrossing(3.0, True), "vllm"))
    assert "## Capacity: 10 programs arriving at once" in table
    assert "| vllm | 30/30 | 3.50 (3.00–4.00) | 1.00 | 6 (5–7) | 1.17 |" in table
    assert "| front | 30/30 | 4.50 (4.00–5.00) | 1.29 | 0 | 1.50 |" in table
    # the reference met every swept rate: its crossing is a lower bound, the ratio a bound
    table = "\n".join(_capacity_table(drains, SloCrossing(3.0, False), "vllm"))
    assert "| front | 30/30 | 4.50 (4.00–5.00) | 1.29 | 0 | ≤ 1.50 |" in table
    assert _capacity_table({}, SloCrossing(3.0, True), "vllm") == []


def test_no_slo_without_a_finished_unloaded_run() -> None:
    with pytest.raises(ValueError, match="no unloaded run of chat"):
        unloaded_latencies([record("chat", None, error="down")])


def test_the_full_plan_has_every_system_of_the_issue(tmp_path: Path) -> None:
    """Every system, built not started: the stock apps straight to one vLLM (with and
    without priority), Eclectus in front of it, and one front per pool routing policy over the
    same two vLLMs; both vLLMs parse tool calls (the tool agent's)."""
    plan = LoadPlan(SYSTEMS, ("fifo",), tmp_path, "tiny", Budget(), tmp_path, vllm_python="py")
    systems = {s.name: s for s in plan.build()}
    assert set(systems) == {
        "vllm", "vllm-priority", "self", "eclectus", "eclectus-vllm",
        "pool-graph", "pool-least-loaded", "pool-round-robin",
    }  # fmt: skip
    vllms = [s for s in plan.servers if isinstance(s, VllmProcess)]
    assert [v.name for v in vllms] == ["vllm", "vllm-b"]
    for v in vllms:
        command = " ".join(v.command())
        assert "--tool-call-parser hermes" in command
    for routing in ("graph", "least-loaded", "round-robin"):
        system = systems[f"pool-{routing}"]
        front = system.server
        assert isinstance(front, EclectusRemoteProcess) and system.engines == vllms
        command = front.command()
        assert command[command.index("--routing") + 1] == routing
        assert [command[i + 1] for i, a in enumerate(command) if a == "--engine-url"] == [
            v.openai_url for v in vllms
        ]
    assert systems["eclectus-vllm"].engines == vllms[:1]
    assert systems["vllm-priority"].priority and not systems["vllm"].priority


def test_each_varied_setting_is_its_own_server_named_by_it(tmp_path: Path) -> None:
    """Two program gaps and two batch caps: four Eclectus servers, each started with its
    own flags and named by the dimensions that vary (the policy does not)."""
    plan = LoadPlan(
        ("eclectus",), ("fifo",), tmp_path, "tiny", Budget(), tmp_path,
        max_engine_seqs=("16", "none"), program_gaps=("0", "1"),
    )  # fmt: skip
    systems = {s.name: s for s in plan.build()}
    assert set(systems) == {"eclectus-s16-g0", "eclectus-s16-g1", "eclectus-snone-g0",
                            "eclectus-snone-g1"}  # fmt: skip
    command = systems["eclectus-snone-g0"].server.command()
    assert command[command.index("--max-engine-seqs") + 1] == "none"
    assert command[command.index("--program-gap") + 1] == "0"
    assert command[command.index("--program-policy") + 1] == "fifo"
    assert command[command.index("--las-tokens-per-s") + 1] == "1000"  # the server's default


def test_las_rates_are_a_setting_too(tmp_path: Path) -> None:
    """``--las-rates 1000,200``: one fair server each, named by its rate; a bad rate is a
    clear error naming the flag."""
    plan = LoadPlan(
        ("eclectus",), ("fair",), tmp_path, "tiny", Budget(), tmp_path, las_rates=("1000", "200")
    )
    systems = {s.name: s for s in plan.build()}
    assert set(systems) == {"eclectus-l1000", "eclectus-l200"}
    command = systems["eclectus-l200"].server.command()
    assert command[command.index("--las-tokens-per-s") + 1] == "200"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="--las-rates 0: tokens/s > 0"):
        _plan(parser.parse_args(["load", "--las-rates", "0"]))


@pytest.mark.slow
def test_quick_mode_writes_a_report_of_the_right_shape(tmp_path: Path) -> None:
    """``eclectus eval load --quick``: Eclectus (both variants) and the stock apps to its
    /v1, two rates, every program type: every run's programs finish, results.json holds
    every run and program, report.md its tables, and the plots are written."""
    out = tmp_path / "load"
    command = [sys.executable, "-m", "eclectus", "eval", "load", "--quick"]
    done = subprocess.run(
        [*command, "--capacity-burst", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    series = {run["series"] for run in results["runs"]}
    assert series == {"self", "eclectus/swap", "eclectus/compiled"}
    assert {run["rate"] for run in results["runs"]} == {1.0, 2.0}
    programs = [p for run in results["runs"] for p in run["records"]]
    assert programs and all(p["end_s"] is not None and p["error"] is None for p in programs)
    assert {u["type"] for u in results["unloaded"]} == set(PROGRAM_TYPES)
    assert set(results["max_rate_meeting_slo"]) == set(results["slo_crossing"]) == series
    # a capacity round per round: 3 programs at once on every series, every one finished
    assert {run["series"] for run in results["bursts"]} == set(results["capacity"]) == series
    for drains in results["capacity"].values():
        assert [(d["num_programs"], d["num_finished"]) for d in drains] == [(3, 3)]
        assert drains[0]["per_s"] > 0
    # the built-in engine's preemption counter is read before and after every run
    assert all(run["num_preemptions"] is not None for run in results["runs"])
    report = (out / "report.md").read_text()
    for heading in (
        "## Unloaded latencies",
        "## Highest rate",
        "## Capacity: 3 programs arriving at once",
        "## 1 programs/s",
        "## 2 programs/s",
    ):
        assert heading in report
    assert "| eclectus/compiled |" in report
    columns = "| series | completed/s | goodput/s | within SLO | failed | unfinished | preempt |"
    assert columns in report
    assert (out / "load-latency.png").stat().st_size > 0
    assert (out / "load-goodput.png").stat().st_size > 0


def test_a_learned_batch_cap_is_a_setting_like_a_number(tmp_path: Path) -> None:
    plan = LoadPlan(
        ("eclectus",), ("fair",), tmp_path, "tiny", Budget(), tmp_path,
        max_engine_seqs=("16", "auto"),
    )  # fmt: skip
    systems = {s.name: s for s in plan.build()}
    assert set(systems) == {"eclectus-s16", "eclectus-sauto"}
    command = systems["eclectus-sauto"].server.command()
    assert command[command.index("--max-engine-seqs") + 1] == "auto"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert _plan(parser.parse_args(["load", "--max-engine-seqs", "8,AUTO"])).max_engine_seqs == (
        "8",
        "auto",
    )
    for bad in ("0", "16,x", "2.5"):  # what `eclectus serve --max-engine-seqs` refuses
        with pytest.raises(ValueError, match=r"--max-engine-seqs .*: integers >= 1, none, auto"):
            _plan(parser.parse_args(["load", "--max-engine-seqs", bad]))


def test_vllms_histograms_are_summed_over_the_engines_and_a_silent_engine_voids_them() -> None:
    """``LoadSystem.engine_times`` over real HTTP: two engines' pages (label sets summed)
    add up; an engine without vLLM's histograms (the built-in engine), or one that does not
    answer, gives None, as a partial sum would make a wrong difference; ``counter`` still
    sums the engines that answer."""
    import http.server
    import threading
    from types import SimpleNamespace

    from eclectus.evals.load.systems import LoadSystem

    vllm_page = (
        'vllm:inter_token_latency_seconds_sum{model_name="tiny"} 2.0\n'
        'vllm:inter_token_latency_seconds_count{model_name="tiny"} 100\n'
        'vllm:request_queue_time_seconds_sum{model_name="tiny"} 0.5\n'
        'vllm:request_queue_time_seconds_count{model_name="tiny"} 10\n'
        'vllm:num_preemptions_total{model_name="tiny"} 3\n'
    )
    pages = {"/a": vllm_page, "/b": vllm_page, "/builtin": "eclectus_engine_preemptions_total 1\n"}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write((body or "").encode())

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"

    def system(*paths: str) -> LoadSystem:
        engines = [SimpleNamespace(metrics_url=base + p) for p in paths]
        return LoadSystem("s", "openai", "tiny", engines[0], engines, "")  # type: ignore[arg-type]

    try:
        times = system("/a", "/b").engine_times()
        assert times == {
            "vllm:inter_token_latency_seconds_sum": 4.0,
            "vllm:inter_token_latency_seconds_count": 200.0,
            "vllm:request_queue_time_seconds_sum": 1.0,
            "vllm:request_queue_time_seconds_count": 20.0,
        }
        assert system("/builtin").engine_times() is None
        assert system("/a", "/down").engine_times() is None
        assert system("/a", "/down").preemptions() == 3.0
        assert system("/a", "/builtin").preemptions() == 4.0
    finally:
        httpd.shutdown()
