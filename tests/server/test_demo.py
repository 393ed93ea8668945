"""``eclectus demo`` runs a map-reduce graph through the SDK and reports what the server saw."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eclectus.demo import demo
from eclectus.models.presets import PRESET_NOTES

pytestmark = pytest.mark.slow


async def test_demo_reports_one_value_for_the_graph(capsys: pytest.CaptureFixture[str]) -> None:
    assert await demo("tiny", 4) == 0
    out = capsys.readouterr().out
    assert "same text: True" in out
    # what it says of the model is docs/models.md's line (tests/engine/test_presets.py)
    assert f"({PRESET_NOTES['tiny']}; --model PATH serves a real checkpoint)" in out
    assert "random" not in out and "meaningless" not in out
    rows = {line[:26].strip(): line[26:].split() for line in out.splitlines() if line[:2] != "  "}
    assert rows["engine calls"] == ["5", "5"]
    assert rows["values sent to client"] == ["1", "5"]
    assert rows["graph depth (calls)"][0] == "2"
    assert int(rows["prefix-cache hit tokens"][0]) > 0


def test_first_run_shows_the_graph_ahead_like_for_like() -> None:
    """A fresh `eclectus demo` process (cold kernels, cold cache) warms up before timing,
    runs each mode from its own cold prefix cache, and the graph is not slower."""
    out = subprocess.run(
        [sys.executable, "-m", "eclectus", "demo"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "warming up" in out.split("what the server saw")[0]
    rows = {line[:26].strip(): line[26:].split() for line in out.splitlines() if line[:2] != "  "}
    graph_s, serial_s = map(float, rows["wall time (s)"])
    hits_graph, hits_serial = rows["prefix-cache hit tokens"]
    assert hits_graph == hits_serial  # neither mode reads the other's cache
    assert graph_s <= serial_s, out
