"""What report.md and the timeline plot say: the workload's shape as run, and which part of
the app each call on the timeline belongs to."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.colors

from eclectus.evals.harness import RunRecord
from eclectus.evals.plots import span_colors, timeline_figure, timeline_plot
from eclectus.evals.report import HEADER, describe, latency_rows, render_report, table_rows
from eclectus.evals.summary import PointSummary
from eclectus.evals.workloads import full_workloads, workload


def test_the_description_is_the_shape_that_ran() -> None:
    """`--set num_chunks=4` on map-reduce reports 4 parallel maps, not the default 8."""
    shrunk = workload("map-reduce", False, {"num_chunks": "4"}, {})
    assert describe(shrunk).startswith("4 parallel maps over 1024-token chunks")
    assert "8 parallel" not in describe(shrunk)
    mixed = describe(workload("mixed", True, {"background.num_chunks": "2"}, {}))
    assert "beside them 2 background jobs kept running from the first chat" in mixed
    assert "2 parallel maps" in mixed
    spread = {"background.num_chunks": "2", "background_concurrency": "none"}
    opened = describe(workload("mixed", True, spread, {}))
    assert "beside them 2 background jobs, one starting every 0.25 s: 2 parallel maps" in opened
    one = describe(workload("mixed", True, {**spread, "background_jobs": "1"}, {}))
    assert "beside them a background job: 2 parallel maps" in one
    for name, chosen in full_workloads().items():
        assert describe(chosen), name


def test_the_report_uses_the_derived_description() -> None:
    chosen = workload("chain-summary", True, {"num_chunks": "2"}, {})
    config = {
        "command": "eclectus eval chain-summary --quick",
        "date": "today",
        "machine": "test",
        "model": "tiny",
        "reps": 1,
        "rtt_ms": 0.0,
        "budget": {},
        "reference": "eclectus",
        "systems": [],
    }
    row = PointSummary(
        "chain-summary", "summary_tokens", 8, "eclectus", 1, 1.0, 1.0, 1.0,
        None, None, None, None, 2, None,
    )  # fmt: skip
    text = render_report(config, [chosen], [row], {})
    assert "refine chain of 2 steps over 256-token chunks" in text


def test_the_table_says_whose_outputs_equal_the_stock_runs() -> None:
    """The last column: "N of N" per system compared, "stock" for the one compared with."""

    def row(system: str, equal: int | None, compared: int) -> PointSummary:
        return PointSummary(
            "map-reduce", "rtt_ms", 0.0, system, 3, 1.0, 1.0, 1.0, None, None, None, None, 17,
            None, num_equal_outputs=equal, num_compared=compared,
        )  # fmt: skip

    assert HEADER.endswith("| outputs equal to the stock run's (greedy) |")
    cells = [
        line.rsplit("|", 2)[1].strip()
        for line in table_rows([row("vllm", None, 0), row("eclectus", 3, 3)])
    ]
    assert cells == ["stock", "3 of 3"]


def test_the_latency_table_shows_the_background_beside_the_chats() -> None:
    """Chat latencies and the background's jobs and output rate, one row per system."""

    def row(system: str, p50: float, jobs: float, rate: float) -> PointSummary:
        return PointSummary(
            "mixed", "rtt_ms", 0.0, system, 2, 0.2, 0.1, 0.3, None, None, None, None, 40, None,
            latencies={"chat p50 latency s": p50},
            background={"analytics jobs done": jobs, "analytics output tok/s": rate},
        )  # fmt: skip

    rows = [row("vllm", 0.3, 9.5, 520.26), row("eclectus-vllm", 0.1, 4, 210)]
    head, _, vllm, ours, _ = latency_rows(rows)
    assert head == (
        "| point | system | chat p50 latency s | analytics jobs done | analytics output tok/s |"
    )
    assert vllm == "| rtt_ms=0.0 | vllm | 0.300 | 9.5 | 520.3 |"
    assert ours == "| rtt_ms=0.0 | eclectus-vllm | 0.100 | 4.0 | 210.0 |"


def _run(system: str, spans: list[tuple[float, float, str]]) -> RunRecord:
    return RunRecord("mixed", "rate", 4.0, system, 0, 2.0, 2.0, len(spans), 2, None, None, spans)


def test_timeline_colors_each_part_of_the_app_alike_and_has_a_legend(tmp_path: Path) -> None:
    """Chats and the background job get one color each, the same in every system's row."""
    runs = [
        _run("eclectus", [(0.0, 1.0, "chat"), (0.1, 1.5, "analytics"), (0.2, 0.5, "chat")]),
        _run("vllm", [(0.0, 0.4, "analytics"), (0.5, 1.0, "chat")]),
    ]
    assert span_colors(runs) == {"chat": "C0", "analytics": "C1"}
    fig = timeline_figure("mixed", runs)
    (legend,) = fig.legends
    assert [text.get_text() for text in legend.get_texts()] == [
        "chat",
        "analytics",
        "the run's end",
    ]
    bars = [(p.get_facecolor(), p.get_width()) for p in fig.axes[1].patches]
    assert [matplotlib.colors.to_hex(color) for color, _ in bars] == [
        matplotlib.colors.to_hex("C1"),
        matplotlib.colors.to_hex("C0"),
    ]  # the vllm row: analytics first, then the chat, each in its part's color
    assert timeline_plot(tmp_path, workload("mixed", True, {}, {}), runs) == "mixed-timeline.png"
    assert (tmp_path / "mixed-timeline.png").stat().st_size > 0
