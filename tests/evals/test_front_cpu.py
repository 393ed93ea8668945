"""The front benchmarks' own arithmetic: CPU seconds from /proc and the top entries of a
py-spy raw profile (the benchmark itself needs stock vLLM and runs by hand)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from eclectus.benchmarks.front import cpu_seconds
from eclectus.benchmarks.front_cpu import (
    Run,
    front_path,
    round_ratios,
    round_wait_differences,
    table,
    top_entries,
)


def test_cpu_seconds_grows_with_work_and_is_zero_for_a_gone_process() -> None:
    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:  # spin: 0.2 s of this process's CPU
        pass
    spent = cpu_seconds(os.getpid()) - before
    assert 0.1 <= spent <= 5.0
    assert cpu_seconds(2**22 + 1) == 0.0  # above the kernel's largest pid


def test_top_entries_skips_idle_waits_and_ranks_by_self_samples(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "main (app.py:1);serve (app.py:9);json_dumps (enc.py:3) 6\n"
        "main (app.py:1);serve (app.py:9);parse (dec.py:7) 3\n"
        "main (app.py:1);serve (app.py:12) 1\n"
        "main (app.py:1);_worker (thread.py:90) 40\n"  # a pool thread waiting for work
        "not a stack line\n"
    )
    num_busy, entries = top_entries(raw, n=3)
    assert num_busy == 10
    assert entries == [
        ("json_dumps (enc.py)", 60.0, 60.0),
        ("parse (dec.py)", 30.0, 30.0),
        ("serve (app.py)", 10.0, 100.0),  # one entry per function, both lines merged
    ]


def _run(path: str, r: int, duration: float, front_cpu_s: float) -> Run:
    role = "vllm_api" if path == "straight" else path
    cpu = {"vllm_api": 0.5, "vllm_core": 2.0, role: front_cpu_s}
    return Run("random", path, r, 100, {"duration": duration, "mean_ttft_ms": 10.0}, cpu, 1.0)


def test_the_round_ratio_pairs_each_round_with_its_own_straight_run() -> None:
    """A slow round slows both paths: paired, its ratio is the same as the quiet rounds'."""
    runs = [
        run
        for r, slow in ((1, 1.0), (2, 3.0), (3, 1.0))
        for run in (_run("straight", r, 1.0 * slow, 0.5), _run("eclectus", r, 1.1 * slow, 0.4))
    ]
    assert [round(x, 6) for x in round_ratios(runs, "random", "eclectus")] == [1.1, 1.1, 1.1]
    assert round_ratios(runs[:2], "random", "nowhere") == []


def test_the_engine_waits_are_the_duration_less_its_busy_seconds() -> None:
    """A run of 3 s whose EngineCore spent 2 s of CPU left the engine 1 s without work; the
    difference between paths is taken round by round."""
    runs = [_run("straight", 1, 2.5, 0.5), _run("eclectus", 1, 3.0, 0.4)]
    assert [r.engine_wait_s() for r in runs] == [0.5, 1.0]
    assert round_wait_differences(runs, "random", "eclectus") == [0.5]


def test_table_gives_each_front_its_own_ratio_against_straight() -> None:
    off = front_path("--admission off")
    assert (front_path(""), off) == ("eclectus", "eclectus --admission off")
    runs = [
        run
        for r in (1, 2, 3)
        for run in (
            _run("straight", r, 1.0, 0.5),
            _run("eclectus", r, 1.25, 0.4),
            _run(off, r, 1.1, 0.3),
        )
    ]
    rows = table(runs).splitlines()
    ratio = "| random | eclectus / straight | 1.25x; per round 1.25 (1.25-1.25)x | 1.00x | 0.80x |"
    assert f"{ratio} | | 0.250 (0.250-0.250) more per round | | | |" in rows
    ratio = "| random | eclectus --admission off / straight | 1.10x; per round 1.10 (1.10-1.10)x"
    assert f"{ratio} | 1.00x | 0.60x | | | 0.100 (0.100-0.100) more per round | | | |" in rows
    assert sum(row.startswith("| random | eclectus --admission off | 1.10") for row in rows) == 1
