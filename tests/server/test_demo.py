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
    graph_steps, serial_steps = map(int, rows["engine steps"])  # the maps batch in the graph
    assert 0 < graph_steps < serial_steps, out


def test_first_run_shows_the_graph_ahead_like_for_like() -> None:
    """A fresh `eclectus demo` process (cold kernels, cold cache) warms up before timing and
    runs each mode from its own cold prefix cache; what the server saw differs only as the
    graph makes it differ, and the graph takes fewer engine steps for the same tokens. The
    wall times are printed, not asserted: how much faster is a benchmark's claim
    (docs/benchmarks.md, "The demo"), and a loaded machine can reverse a single run's."""
    out = subprocess.run(
        [sys.executable, "-m", "eclectus", "demo"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "warming up" in out.split("what the server saw")[0]
    assert "same text: True" in out
    rows = {line[:26].strip(): line[26:].split() for line in out.splitlines() if line[:2] != "  "}
    assert all(float(seconds) > 0 for seconds in rows["wall time (s)"])
    # the warm-up's calls are not counted: each mode ran its own 5 calls
    assert rows["engine calls"] == ["5", "5"]
    # one submit for the whole graph, one per call one by one; both then close alike (+2)
    assert rows["client frames received"] == ["3", "7"]
    assert rows["values sent to client"] == ["1", "5"]
    hits_graph, hits_serial = map(int, rows["prefix-cache hit tokens"])
    # neither mode reads the cache the warm-up or the other filled: each shares only the
    # system prompt among its own 4 maps (one by one would otherwise hit the maps' prompts)
    assert hits_graph == hits_serial > 0
    # the graph's lead, counted rather than timed: its 4 maps decode as one batch, so the
    # engine takes fewer steps for the same calls and tokens than one by one
    assert rows["tokens generated"][0] == rows["tokens generated"][1]
    graph_steps, serial_steps = map(int, rows["engine steps"])
    assert 0 < graph_steps < serial_steps, out
