"""evals/vllm_bench: the client command, the URL it targets, the table, bad arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from eclectus.evals import vllm_bench
from eclectus.evals.budget import Budget
from eclectus.evals.servers import EclectusProcess, VllmProcess


def test_client_targets_each_servers_openai_root(tmp_path: Path) -> None:
    """--base-url is the server's OpenAI URL without /v1; the workload and seed are passed."""
    model = tmp_path / "tiny-abc"
    ours = EclectusProcess("eclectus", model, Budget(), tmp_path / "log")
    theirs = VllmProcess("vllm", model, Budget(), tmp_path / "log2", python="py")
    for server in (ours, theirs):
        cmd = vllm_bench.bench_command(
            "py", server, "served", model, "prefix-1x2048", 7, tmp_path / "r.json"
        )
        assert cmd[cmd.index("--base-url") + 1] == f"http://127.0.0.1:{server.port}"
        assert server.openai_url == cmd[cmd.index("--base-url") + 1] + "/v1"
        assert cmd[cmd.index("--prefix-repetition-prefix-len") + 1] == "2048"
        assert cmd[cmd.index("--seed") + 1] == "7"
        assert cmd[cmd.index("--model") + 1] == "served"
        assert cmd[cmd.index("--tokenizer") + 1] == str(model)
        assert {"--ignore-eos", "/v1/completions", "inf"} <= set(cmd)


def test_table_gives_medians_and_ratios() -> None:
    def metrics(duration: float) -> dict[str, float]:
        return dict(duration=duration, mean_ttft_ms=100, mean_tpot_ms=10, output_throughput=50)

    runs = [
        vllm_bench.Run("tiny", "random", "vllm", 1, metrics(2.0)),
        vllm_bench.Run("tiny", "random", "vllm", 2, metrics(4.0)),
        vllm_bench.Run("tiny", "random", "vllm", 3, metrics(3.0)),
        vllm_bench.Run("tiny", "random", "eclectus", 1, metrics(1.5)),
    ]
    text = vllm_bench.table(runs)
    assert "| tiny | random | vllm | 3.00 (2.00-4.00) |" in text
    assert "| tiny | random | eclectus / vllm | 0.50x | 1.00x |" in text


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = vllm_bench.main(["--vllm-python", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert status == 2
    assert "error:" in capsys.readouterr().err


def test_the_issue_shapes_and_model_flag() -> None:
    """Issue #18's three datasets, as vLLM's client takes them, and ``--model small`` (the
    documented quiet-machine command) selecting the model."""
    args = {name: " ".join(argv) for name, argv in vllm_bench.WORKLOADS.items()}
    assert "--random-input-len 512 --random-output-len 64 --num-prompts 32" in args["random"]
    assert (
        "--prefix-repetition-prefix-len 1536 --prefix-repetition-suffix-len 64 "
        "--prefix-repetition-num-prefixes 2 --prefix-repetition-output-len 32 --num-prompts 32"
    ) in args["prefix-2x1536"]
    assert (
        "--prefix-repetition-prefix-len 2048 --prefix-repetition-suffix-len 32 "
        "--prefix-repetition-num-prefixes 1 --prefix-repetition-output-len 64 --num-prompts 64"
    ) in args["prefix-1x2048"]
    parser = argparse.ArgumentParser()
    vllm_bench.add_arguments(parser)
    parsed = parser.parse_args(
        ["--vllm-python", "py", "--model", "small", "--workloads", "random,prefix-2x1536"]
    )
    assert parsed.models == "small"
    assert parsed.workloads == "random,prefix-2x1536"
