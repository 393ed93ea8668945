"""The decode-step breakdown benchmark: it runs, and times each part within its step."""

from __future__ import annotations

import random

import pytest

from eclectus.server.engine import step_bench
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


def test_an_unknown_shape_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        step_bench.main(["--shapes", "random,nope"])
    assert exit_info.value.code == 2
    assert "unknown shape 'nope'" in capsys.readouterr().err
