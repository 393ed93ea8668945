"""The batch benchmark runs end to end at the smallest sizes and prints its table."""

from __future__ import annotations

import pytest

from eclectus.benchmarks.engine import batch as batch_bench


def test_batch_bench_prints_one_row_per_batch(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--batches", "1,2", "--rounds", "2", "--prompt-tokens", "8", "--output-tokens", "2"]
    assert batch_bench.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["1", "2"]
    assert any(row.split("|")[4].strip() == "100%" for row in rows[1:])
