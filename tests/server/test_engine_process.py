"""The server with its engine core in its own process: serves as with the in-process engine,
answers errors (and stays up) when the core dies, and leaves no core behind on Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest

from eclectus.evals.cpus import children
from eclectus.server.config import ServerConfig
from eclectus.server.engine import EngineConfig, ProcessEngine
from eclectus.server.front.app import EclectusServer, start_server

pytestmark = pytest.mark.slow


@pytest.fixture
async def server() -> AsyncIterator[EclectusServer]:
    engine = ProcessEngine(EngineConfig(model="tiny", num_kv_blocks=128))
    server = await start_server(ServerConfig(port=0), engine, owns_backend=True)
    yield server
    await server.close()


async def test_v1_serves_then_answers_errors_when_the_core_dies(server: EclectusServer) -> None:
    client = openai.AsyncOpenAI(base_url=server.openai_url, api_key="none", max_retries=0)
    done = await client.completions.create(model="tiny", prompt="Once upon", max_tokens=6)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage is not None
    assert done.usage.completion_tokens >= 1
    engine = server.backend
    assert isinstance(engine, ProcessEngine)
    os.kill(engine.pid, signal.SIGKILL)
    for _ in range(500):
        if engine.exit_code is not None:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(openai.APIStatusError, match="exited"):
        await client.completions.create(model="tiny", prompt="Once upon", max_tokens=6)
    health = await asyncio.to_thread(urllib.request.urlopen, server.http_url + "/healthz")
    assert json.loads(health.read())["status"] == "ok"  # the server lives on


@pytest.fixture
def ctrl_c_server() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "eclectus", "serve", "--port", "0", "--engine-process", "on"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ctrl_c_stops_the_server_and_its_core(ctrl_c_server: subprocess.Popen[str]) -> None:
    """SIGINT to the whole process group (what Ctrl-C sends): the core ignores it, the server
    drains, stops its core and exits 0; no core process is left."""
    assert ctrl_c_server.stderr is not None
    for line in ctrl_c_server.stderr:
        if re.search(r"eclectus serving .* on ws://", line):  # after its signal handlers
            break
    cores = children(ctrl_c_server.pid)
    assert len(cores) == 1
    os.killpg(ctrl_c_server.pid, signal.SIGINT)
    assert ctrl_c_server.wait(timeout=60) == 0
    for _ in range(100):  # an orphan would be reparented and live on
        if not Path(f"/proc/{cores[0]}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{cores[0]}").exists()
