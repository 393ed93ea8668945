"""Engines that cannot take token ids: a real ``eclectus serve`` engine behind a real proxy
that takes the capability away (no ``/tokenize``; or ``/v1/completions`` refusing token-id
prompts). Eclectus then sends text prompts, tokenized by the engine itself."""

from __future__ import annotations

from typing import Any

import pytest
from remote_helpers import (
    CONSTRAINTS,
    EngineProcess,
    RecordingProxy,
    assert_valid,
    constrained_frame,
    fan_out,
    reference,
    remote_backend,
    run_graph,
    serve_http,
)
from ws_helpers import map_reduce

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server

pytestmark = pytest.mark.slow

PROMPT_0 = "You are a careful assistant. Answer briefly.\nQuestion 0: what is 0 plus 0?\nAnswer:"


@pytest.mark.parametrize("lack", ["no_tokenize", "text_only"])
async def test_text_prompts_when_token_ids_cannot_be_sent(
    engines: list[EngineProcess], builtin: object, lack: str
) -> None:
    """The handshake notices the missing capability; every call goes as its text. A prompt
    of one segment tokenizes the same either way, so the output is the built-in engine's;
    a graph whose prompts join several segments still completes (the engine tokenizes the
    joined text: a token may straddle a boundary, docs/engines.md). Constraints still hold."""
    options: dict[str, Any] = {lack: True}
    proxy = RecordingProxy(engines[0].url, **options)
    http, url = await serve_http(proxy.handle)
    backend = remote_backend([url])
    try:
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            assert backend.pool.engines[0].member.info.token_prompts is False  # type: ignore[attr-defined]
            got = await run_graph(server, fan_out(2), 2)
            assert {k: v["text"] for k, v in got.items()} == await reference(builtin, fan_out(2), 2)
            final = await run_graph(server, map_reduce(3), 1)
            assert final["final"]["type"] == "value" and final["final"]["text"]
            kinds = list(CONSTRAINTS)
            constrained = await run_graph(server, constrained_frame(kinds), len(kinds))
        for kind in kinds:
            assert_valid(kind, constrained[kind]["text"])
        streamed = [b for b in proxy.bodies if b.get("stream")]
        assert streamed and all(isinstance(b["prompt"], str) for b in streamed)
        assert PROMPT_0 in [b["prompt"] for b in streamed]
    finally:
        await http.close()
        await proxy.aclose()
