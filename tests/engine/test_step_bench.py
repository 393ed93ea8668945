"""The decode-step breakdown benchmark: it runs, and times each part within its step."""

from __future__ import annotations

import random

import pytest
import torch

from eclectus.benchmarks.engine import step as step_bench
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm_engine import LLMEngine


def test_every_part_of_a_decode_step_is_timed_within_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small shared-prefix shape: every part is timed, none is negative, and none exceeds
    the step it is part of (step by step, so their medians too)."""
    monkeypatch.setitem(step_bench.SHAPES, "mini", (8, 1, 256, 8, 6))
    engine = LLMEngine(EngineConfig(model="tiny", num_threads=1))
    ms = step_bench.decode_parts(engine, "mini", random.Random(0))
    assert set(ms) == set(step_bench.PARTS)
    assert all(value >= 0 for value in ms.values())
    assert all(value <= ms["step"] for value in ms.values())


def test_every_part_of_a_prefill_step_is_timed_within_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The steps before the last first token (chunks under a small budget): every part is
    timed and within its step, the steps are counted and summed, and F.linear is unwrapped
    afterwards."""
    monkeypatch.setitem(step_bench.SHAPES, "mini", (6, 0, 0, 96, 4))
    linear = torch.nn.functional.linear
    engine = LLMEngine(EngineConfig(model="tiny", num_threads=1, max_num_batched_tokens=256))
    ms = step_bench.prefill_parts(engine, "mini", random.Random(0))
    assert set(ms) == {*step_bench.PREFILL_PARTS, "steps", "total"}
    assert ms["steps"] >= 3  # 576 prompt tokens, 256 a step
    assert ms["matmuls"] > 0 and ms["attention kernels"] > 0
    assert all(ms[part] <= ms["step"] for part in step_bench.PREFILL_PARTS)
    assert ms["step"] <= ms["total"]
    assert torch.nn.functional.linear is linear


def test_an_unknown_shape_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        step_bench.main(["--shapes", "random,nope"])
    assert exit_info.value.code == 2
    assert "unknown shape 'nope'" in capsys.readouterr().err


def test_two_options_compared_at_once_is_one_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        step_bench.main(["--sampled-rows", "both", "--column-major-weights", "both"])
    assert exit_info.value.code == 2
    assert "compare one at a time" in capsys.readouterr().err
