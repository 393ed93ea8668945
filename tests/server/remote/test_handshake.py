"""Start-up refusals: an engine with another tokenizer, or none reachable. The engines are
small real HTTP servers; ``eclectus serve`` runs as a user runs it."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from remote_helpers import fake_engine, free_port, serve_http

from eclectus.server.remote import RemoteConfig, RemoteStartError, build_remote_backend
from eclectus.server.remote.handshake import PROBE

pytestmark = pytest.mark.slow


async def serve_cli(*flags: str) -> tuple[int, str]:
    """Run ``eclectus serve --model tiny FLAGS`` to its exit: (exit code, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "eclectus",
        "serve",
        "--model",
        "tiny",
        "--port",
        "0",
        *flags,
        stderr=subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, stderr.decode()


async def test_another_tokenizer_is_refused_with_one_line() -> None:
    """An engine whose /tokenize disagrees with the local tokenizer on the probe string:
    the backend will not start, and ``eclectus serve`` exits 2 with one line saying so."""
    backend = build_remote_backend(RemoteConfig(model="tiny", engine_urls=("http://x/v1",)))
    ours = backend.tokenizer.encode(PROBE)
    server, url = await serve_http(fake_engine([*ours[:5], ours[5] + 1, *ours[6:]]))
    try:
        mismatched = build_remote_backend(RemoteConfig(model="tiny", engine_urls=(url,)))
        with pytest.raises(RemoteStartError, match="first difference at token 5"):
            await mismatched.start()
        await mismatched.shutdown()
        code, stderr = await serve_cli("--engine-url", url)
        assert code == 2 and "Traceback" not in stderr
        assert (
            stderr.strip()
            .splitlines()[-1]
            .startswith(f"eclectus serve: engine {url} (model 'other-model') tokenizes differently")
        )
    finally:
        await server.close()


async def test_no_reachable_engine_is_refused() -> None:
    """Nothing listens at the URL: exit 2 naming the engine and why; malformed URL flags
    are refused by name."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    code, stderr = await serve_cli("--engine-url", url)
    assert code == 2 and f"no engine can be reached ({url}: " in stderr.strip().splitlines()[-1]
    code, stderr = await serve_cli("--engine-url", "localhost:8000")
    assert code == 2 and "must start with http:// or https://" in stderr
    code, stderr = await serve_cli("--engine-url", url, "--engine-url", url + "/")
    assert code == 2 and "the same URL is given twice" in stderr
