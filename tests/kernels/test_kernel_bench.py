"""The benchmark runs end to end on CPU and reports ratios for the sizes it is given."""

from __future__ import annotations

import contextlib

import pytest
import torch

from eclectus.benchmarks.kernels import paged_decode as bench_decode
from eclectus.benchmarks.kernels import shared_prefix as bench
from eclectus.kernels.dispatch import force_backend


def test_parse_sizes() -> None:
    assert bench.parse_sizes("16:1024:64,64:8192:16") == [(16, 1024, 64), (64, 8192, 16)]


def test_bench_prints_one_row_per_size(
    backend_choice: contextlib.ExitStack, capsys: pytest.CaptureFixture[str]
) -> None:
    backend_choice.enter_context(force_backend("torch"))
    assert bench.main(["--device", "cpu", "--sizes", "4:128:8,3:32:5", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "torch path" in lines[0] and "peak" in lines[0]
    row = lines[-2].split()
    assert row[:3] == ["4", "128", "8"] and row[6].endswith("x") and row[7].endswith("x")
    assert float(row[-1]) < 1e-4  # cascade output equals plain paged output
    assert lines[-1].split()[:3] == ["3", "32", "5"] and "too short" in lines[-1]


def test_decode_bench_prints_one_row_per_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU decode benchmark times the native kernel and the torch path against two in-run
    baselines; every path computes the same attention."""
    args = ["--batches", "3", "--lens", "40:90", "--block-sizes", "4,16", "--layers", "2"]
    assert bench_decode.main([*args, "--repeats", "1", "--rounds", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[:3] for row in rows] == [["3", "40-90", "4"], ["3", "40-90", "16"]]
    for row in rows:
        assert all(cell.endswith("x") for cell in row[7:10])  # torch, token-rows, sdpa ratios
        assert float(row[-1]) < 1e-4  # native, torch and token-row outputs agree


def test_bench_names_the_decode_path_that_serves(backend_choice: contextlib.ExitStack) -> None:
    """The header says what the two decode columns run: on a CPU with the native kernel, native
    paged decode (the cascade's suffix too); forced to torch, the torch paths."""
    from eclectus.kernels import native

    cpu = torch.device("cpu")
    backend_choice.enter_context(force_backend("torch"))
    assert bench.decode_path(cpu, torch.float32) == "torch paths"
    backend_choice.enter_context(force_backend(""))
    assert bench.decode_path(cpu, torch.bfloat16) == "torch paths"
    if native.available():
        assert bench.decode_path(cpu, torch.float32).startswith("native C paged decode")
