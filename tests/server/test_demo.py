"""``eclectus demo`` runs a map-reduce graph through the SDK and reports what the server saw."""

from __future__ import annotations

import pytest

from eclectus.server.demo import demo

pytestmark = pytest.mark.slow


async def test_demo_reports_one_value_for_the_graph(capsys: pytest.CaptureFixture[str]) -> None:
    assert await demo("tiny", 4) == 0
    out = capsys.readouterr().out
    assert "same text: True" in out
    rows = {line[:26].strip(): line[26:].split() for line in out.splitlines() if line[:2] != "  "}
    assert rows["engine calls"] == ["5", "5"]
    assert rows["values sent to client"] == ["1", "5"]
    assert rows["graph depth (calls)"][0] == "2"
    assert int(rows["prefix-cache hit tokens"][0]) > 0
