"""Several front processes on one port (``--api-server-count``), as real processes in front
of a real engine process: a session's frames all land on its process, /v1 requests spread
over the workers, and SIGTERM drains every worker; unsupported combinations are refused."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from eclectus.adapters.client import connect

STARTUP_TIMEOUT_S = 120.0
NUM_TOKENS = 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_line(proc: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    """The first stderr line of ``proc`` matching ``pattern`` (blocking)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    seen = []
    for line in proc.stderr:
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
        if time.monotonic() > deadline:
            break
    raise AssertionError("never saw the line:\n" + "".join(seen[-20:]))


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    """The instant test engine, streaming a token every 100 ms so requests stay in flight."""
    command = [sys.executable, "-m", "eclectus.benchmarks.instant_engine", "--token-delay", "0.1"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        yield wait_line(proc, r"on (http://\S+/v1)").group(1)
    finally:
        proc.kill()
        proc.wait()


def start_front(engine_url: str, *extra: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    command = [sys.executable, "-m", "eclectus.server", "--model", "tiny", "--port", str(port)]
    command += ["--engine-url", engine_url, "--log-level", "WARNING", *extra]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True), port


async def chain_on_one_session(url: str, n: int) -> str:
    """A session of several frames: each later submit names the variable an earlier one
    made, so every frame must reach the process that holds the session's graph."""
    async with connect(url) as app:
        first = app.function("Say {{x}}:{{a}}", a={"max_tokens": 2})(x=str(n))
        await first.aget()
        second = app.function("Then {{y}}:{{b}}", b={"max_tokens": 2})(y=first)
        third = app.function("And {{z}}:{{c}}", c={"max_tokens": 2})(z=second)
        return await third.aget()


async def streamed(http: httpx.AsyncClient, url: str, started: list[str]) -> tuple[str, str]:
    """One streamed /v1 completion on a connection of its own: its worker and its text
    (the worker also goes to ``started`` once the response began)."""
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": NUM_TOKENS, "stream": True}
    text = ""
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        worker = response.headers["eclectus-worker"]
        started.append(worker)
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = httpx.Response(200, content=line[6:]).json()
                text += "".join(c.get("text", "") for c in chunk.get("choices", []))
    return worker, text


@pytest.mark.slow
async def test_two_fronts_serve_sessions_spread_v1_and_drain(engine_url: str) -> None:
    """Sessions keep their frames on one process; /v1 requests reach both workers; a
    SIGTERM mid-stream lets every request finish, then every process exits cleanly."""
    proc, port = start_front(engine_url, "--api-server-count", "2", "--engine-stream-interval", "1")
    try:
        await asyncio.to_thread(wait_line, proc, r"eclectus serving .*\[2 front processes\]")
        url = f"http://127.0.0.1:{port}"
        finals = await asyncio.gather(
            *(chain_on_one_session(f"ws://127.0.0.1:{port}", n) for n in range(8))
        )
        assert all(final == " a a" for final in finals)
        limits = httpx.Limits(max_keepalive_connections=0)  # a new connection per request
        async with httpx.AsyncClient(limits=limits, timeout=60) as http:
            started: list[str] = []
            streams = [asyncio.ensure_future(streamed(http, url, started)) for _ in range(24)]
            deadline = asyncio.get_running_loop().time() + 30
            while len(started) < len(streams):  # every one answered and streaming
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            assert not any(s.done() for s in streams)  # 20 tokens at 100 ms: still in flight
            proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*streams)
        assert {worker for worker, _ in results} == {"0", "1"}
        assert all(text == " a" * NUM_TOKENS for _, text in results)
        assert await asyncio.to_thread(proc.wait, 60) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ((), "needs --engine-url"),
        (
            ("--engine-url", "http://127.0.0.1:9/v1", "--engine", "builtin"),
            "cannot run --engine builtin",
        ),
    ],
)
def test_unsupported_combinations_are_refused(flags: tuple[str, ...], says: str) -> None:
    """Several fronts would each load a built-in engine: one line says what to do instead."""
    command = [sys.executable, "-m", "eclectus.server", "--api-server-count", "2", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("eclectus serve:")
