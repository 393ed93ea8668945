"""The server's event loop (server/event_loop.py): uvloop by default, asyncio's on request,
a clear refusal when uvloop is asked for and missing; and ``eclectus serve`` serving on each."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import uvloop
from scripted_engine import ScriptedEngine

from eclectus.server.config import ServerConfig
from eclectus.server.event_loop import LOOPS, loop_factory, run
from eclectus.server.front.app import serve_in_thread


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_auto_and_uvloop_run_on_uvloop_asyncio_on_its_own() -> None:
    assert run(_loop_type(), loop_factory("auto")) is uvloop.Loop
    assert run(_loop_type(), loop_factory("uvloop")) is uvloop.Loop
    assert run(_loop_type(), loop_factory("asyncio")) is asyncio.SelectorEventLoop
    assert set(LOOPS) == {"auto", "asyncio", "uvloop"}


def test_an_unknown_loop_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--loop trio: choose from auto, asyncio, uvloop"):
        loop_factory("trio")  # type: ignore[arg-type]


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert loop_factory("auto") is asyncio.new_event_loop
    with pytest.raises(ValueError, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_an_in_process_server_runs_on_the_loop_serve_runs_on() -> None:
    """serve_in_thread (tests, embedding) gets the same loop as ``eclectus serve``, so the
    in-process suites exercise the production loop."""
    loops: list[type] = []

    def factory() -> ScriptedEngine:
        loops.append(type(asyncio.get_running_loop()))
        return ScriptedEngine()

    with serve_in_thread(ServerConfig(port=0), factory) as server:
        health = urllib.request.urlopen(server.http_url + "/healthz", timeout=10)
        assert health.status == 200
    assert loops == [uvloop.Loop]


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_serve_answers_a_stream_on_either_loop(loop: str) -> None:
    """``eclectus serve --loop L`` streams a /v1 completion on the built-in engine."""
    from test_cli_serve import serving

    with serving("--model", "tiny", "--loop", loop) as url:
        body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4, "stream": True})
        request = urllib.request.Request(
            url.replace("ws://", "http://") + "/v1/completions",
            data=body.encode(),
            headers={"Content-Type": "application/json"},
        )
        events = urllib.request.urlopen(request, timeout=60).read().decode().split("\n\n")
        assert events[-2] == "data: [DONE]"
        assert any('"text"' in event for event in events)


def test_serve_with_uvloop_missing_exits_2_in_one_line(tmp_path: Path) -> None:
    hidden = tmp_path / "uvloop"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    done = subprocess.run(
        [sys.executable, "-m", "eclectus", "serve", "--port", "0", "--loop", "uvloop"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "eclectus serve: --loop uvloop: uvloop is not installed (pip install uvloop)"
    )
