"""The front benchmarks' own arithmetic: CPU seconds from /proc and the top entries of a
py-spy raw profile (the benchmark itself needs stock vLLM and runs by hand)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from eclectus.benchmarks.front import cpu_seconds
from eclectus.benchmarks.front_cpu import top_entries


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
