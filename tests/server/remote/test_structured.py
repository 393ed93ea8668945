"""Structured outputs and tools through remote engines (real ``eclectus serve`` engine
processes): each constraint travels in the engine's own request fields, the output is valid
by construction and, under greedy decoding, exactly the built-in engine's; an engine that
cannot enforce a constraint never decodes it unconstrained."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from remote_helpers import (
    CHOICES,
    CONSTRAINTS,
    SCHEMA,
    WEATHER,
    EngineProcess,
    RecordingProxy,
    assert_valid,
    constrained_frame,
    reference,
    remote_backend,
    run_graph,
    serve_http,
)
from tool_fixtures import ASK

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server
from eclectus.server.remote import RoutingPolicy
from eclectus.server.remote.dialect import Dialect

pytestmark = pytest.mark.slow


async def test_every_constraint_kind_reaches_the_engine_and_holds(
    engines: list[EngineProcess], builtin: object
) -> None:
    """JSON schema, JSON object, regex, choice and grammar: the engine receives each in
    vLLM's ``structured_outputs`` field, and the graph gets valid output equal to the
    built-in engine's (greedy)."""
    proxy = RecordingProxy(engines[0].url)
    http, url = await serve_http(proxy.handle)
    backend = remote_backend([url])
    kinds = list(CONSTRAINTS)
    try:
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            assert backend.pool.engines[0].member.info.dialect is Dialect.VLLM  # type: ignore[attr-defined]
            got = await run_graph(server, constrained_frame(kinds), len(kinds))
        texts = {k: v["text"] for k, v in got.items()}
        assert texts == await reference(builtin, constrained_frame(kinds), len(kinds))
        for kind in kinds:
            assert_valid(kind, texts[kind])
        sent = [b["structured_outputs"] for b in proxy.bodies if b.get("stream")]
        assert sorted(next(iter(s)) for s in sent) == sorted(kinds)
        assert {"json": SCHEMA} in sent and {"choice": CHOICES} in sent
    finally:
        await http.close()
        await proxy.aclose()


async def test_an_engine_ignoring_structured_outputs_gets_guided_fields(
    engines: list[EngineProcess], builtin: object
) -> None:
    """An engine that silently ignores ``structured_outputs`` (as vLLM < 0.10 does) is found
    out at the handshake and sent vLLM's older ``guided_*`` fields instead: still valid and
    equal to the built-in engine's output."""
    proxy = RecordingProxy(engines[0].url, drop_fields=("structured_outputs",))
    http, url = await serve_http(proxy.handle)
    backend = remote_backend([url])
    kinds = ["json", "regex", "choice", "grammar"]
    try:
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            assert backend.pool.engines[0].member.info.dialect is Dialect.VLLM_GUIDED  # type: ignore[attr-defined]
            got = await run_graph(server, constrained_frame(kinds), len(kinds))
        texts = {k: v["text"] for k, v in got.items()}
        assert texts == await reference(builtin, constrained_frame(kinds), len(kinds))
        for kind in kinds:
            assert_valid(kind, texts[kind])
        streamed = [b for b in proxy.bodies if b.get("stream")]
        assert {k for b in streamed for k in b if k.startswith("guided_")} == {
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        }
    finally:
        await http.close()
        await proxy.aclose()


CONSTRAINT_FIELDS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "json_schema",
    "regex",
    "ebnf",
    "response_format",
)


async def test_a_constraint_no_engine_enforces_is_refused_never_ignored(
    engines: list[EngineProcess],
) -> None:
    """An engine that ignores every constraint field gets no constrained call: alone, the
    call fails with ``engine_error`` naming the kind (and free calls still run); beside an
    engine that enforces them, every constrained call goes to that one."""
    deaf = RecordingProxy(engines[0].url, drop_fields=CONSTRAINT_FIELDS)
    http, url = await serve_http(deaf.handle)
    try:
        backend = remote_backend([url])
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            assert backend.pool.engines[0].member.info.dialect is Dialect.NONE  # type: ignore[attr-defined]
            got = await run_graph(server, constrained_frame(["choice"]), 1)
            assert got["choice"]["type"] == "error"
            assert got["choice"]["code"] == "engine_error"
            assert "'choice'" in got["choice"]["message"]
            free = {"type": "submit", "vars": [], "calls": [], "gets": [{"var": "a"}]}
            free["calls"] = [{"id": "c", "template": "Hi{{a}}", "bind": {"a": "a"}}]
            free["calls"][0]["sampling"] = {"a": {"max_tokens": 4}}
            assert (await run_graph(server, free, 1))["a"]["type"] == "value"
        before = len(deaf.bodies)
        backend = remote_backend([url, engines[1].url])
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            got = await run_graph(server, constrained_frame(list(CONSTRAINTS)), len(CONSTRAINTS))
        assert all(v["type"] == "value" for v in got.values())
        for kind, answer in got.items():
            assert_valid(kind, answer["text"])
        assert not [b for b in deaf.bodies[before:] if b.get("stream")]
    finally:
        await http.close()
        await deaf.aclose()


async def test_a_constrained_call_fails_over_only_before_its_output(
    engines: list[EngineProcess], builtin: object
) -> None:
    """An engine that fails before any output: the constrained call fails over and is valid
    (the built-in engine's text). One that drops the stream mid-output: the call fails with
    ``engine_error`` (another engine's grammar would start over mid-structure), and what it
    streamed is not streamed again."""
    failing = RecordingProxy(engines[0].url, fail_streams=True)
    cutting = RecordingProxy(engines[0].url, cut_after=2)
    servers = [await serve_http(failing.handle), await serve_http(cutting.handle)]
    frame = constrained_frame(["json"])
    try:
        for (_, url), expect_value in zip(servers, (True, False), strict=True):
            backend = remote_backend([url, engines[1].url], routing=RoutingPolicy.ROUND_ROBIN)
            config = ServerConfig(port=0)
            async with await start_server(config, backend, owns_backend=True) as server:
                got = (await run_graph(server, frame, 1))["json"]
            if expect_value:
                assert got["type"] == "value" and backend.num_failovers == 1
                assert got["text"] == (await reference(builtin, frame, 1))["json"]
            else:
                assert got["type"] == "error" and got["code"] == "engine_error", got
                assert "constrained output cannot continue" in got["message"]
                assert backend.num_failovers == 0
    finally:
        for http, _ in servers:
            await http.close()
        await failing.aclose()
        await cutting.aclose()


async def chat(base_url: str, **body: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=120) as client:
        answer = await client.post(
            f"{base_url}/chat/completions", json={"model": "tiny", "messages": ASK, **body}
        )
        return {"status": answer.status_code, **answer.json()}


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
async def test_tool_calls_through_remote_engines_equal_builtin(
    engines: list[EngineProcess], builtin: object, tool_choice: Any
) -> None:
    """A chat request with tools through the front server's OpenAI endpoint: the tools are
    rendered here, the tool-call grammar goes to the engine as a structural tag, and the
    reply parsed here is a well-formed call, equal to the built-in engine's."""
    proxy = RecordingProxy(engines[0].url)
    http, url = await serve_http(proxy.handle)
    body = {"tools": [WEATHER], "tool_choice": tool_choice, "max_tokens": 64}
    try:
        backend = remote_backend([url])
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            remote = await chat(server.openai_url, **body)
        local_server = await start_server(ServerConfig(port=0), builtin, owns_backend=False)  # type: ignore[arg-type]
        async with local_server:
            local = await chat(local_server.openai_url, **body)
        assert remote["status"] == local["status"] == 200, remote
        (call,) = remote["choices"][0]["message"]["tool_calls"]
        assert remote["choices"][0]["finish_reason"] == "tool_calls"
        assert call["function"]["name"] == "get_weather"
        assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
        (expected,) = local["choices"][0]["message"]["tool_calls"]
        assert call["function"] == expected["function"]
        (sent,) = [b for b in proxy.bodies if b.get("stream")]
        tag = json.loads(sent["structured_outputs"]["structural_tag"])
        assert tag["type"] == "structural_tag" and "get_weather" in json.dumps(tag)
    finally:
        await http.close()
        await proxy.aclose()


async def test_engine_completions_enforce_constraints_and_refuse_tools(
    engines: list[EngineProcess],
) -> None:
    """An Eclectus engine's /v1/completions (what a remote backend talks to) enforces
    ``structured_outputs`` and ``guided_*`` on text prompts too, and refuses ``tools`` (a chat
    field) with a 400 naming it rather than ignoring them."""
    body = {"model": "tiny", "prompt": "Pick one:", "max_tokens": 8, "temperature": 0}
    async with httpx.AsyncClient(timeout=120) as client:
        url = f"{engines[0].url}/completions"
        for extra in ({"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES}):
            answer = (await client.post(url, json={**body, **extra})).json()
            assert answer["choices"][0]["text"] in CHOICES
        refused = await client.post(url, json={**body, "tools": [WEATHER]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
