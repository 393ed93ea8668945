"""The real server for the adapters' integration tests: built-in engine, tiny model; with
auth on in this process (``serve_live``), as the default of the model classes
(``serve_as_default``), or as a process of its own that a test may kill (``serve_process``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

from eclectus.server.backend import Backend
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

LIVE_TOKEN = "sdk-live-token"


def guaranteed_engine() -> Backend:
    """The tiny engine with the opt-in budget guarantee (off by default, as on stock vLLM):
    these tests' tool calls and JSON replies must parse at small budgets, and ``tiny``
    writes whitespace in them until ``max_tokens`` (docs/engine.md, "Budget guarantee")."""
    from eclectus.server.engine import AsyncEngine

    return AsyncEngine.from_config(model="tiny", budget_guarantee=True)


@dataclass(frozen=True)
class LiveServer:
    """A running server and the token it requires."""

    server: EclectusServer
    token: str

    @property
    def url(self) -> str:
        return self.server.url


@contextmanager
def serve_live(**limits: int) -> Iterator[LiveServer]:
    """Serves on a free loopback port on its own loop thread until the block ends; ``limits``
    override ServerConfig fields (default here: max_prompt_tokens=2048). Its engine has the
    budget guarantee on (:func:`guaranteed_engine`)."""
    config = ServerConfig(
        port=0, model="tiny", token=LIVE_TOKEN, **{"max_prompt_tokens": 2048, **limits}
    )
    with serve_in_thread(config, guaranteed_engine) as server:
        yield LiveServer(server, LIVE_TOKEN)


@contextmanager
def serve_as_default() -> Iterator[EclectusServer]:
    """Serves (no auth) on a free loopback port until the block ends, with ``ECLECTUS_URL``
    pointing at it meanwhile: the adapters' model classes read it when constructed. Its
    engine has the budget guarantee on (:func:`guaranteed_engine`)."""
    with (
        serve_in_thread(ServerConfig(port=0, model="tiny"), guaranteed_engine) as server,
        mock.patch.dict(os.environ, {"ECLECTUS_URL": server.url}),
    ):
        yield server


@contextmanager
def serve_process() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m eclectus.server --model tiny`` on a free loopback port (no auth): its URL
    and process, once /healthz answers. The process is killed when the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "eclectus.server", "--port", str(port), "--model", "tiny"]
    process = subprocess.Popen([*command, "--log-level", "WARNING"], stdout=subprocess.DEVNULL)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/healthz", process, timeout=120)
        yield f"ws://127.0.0.1:{port}", process
    finally:
        process.kill()
        process.wait(30)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server process did not come up (exit code {process.poll()})")
