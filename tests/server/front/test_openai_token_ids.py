"""Token-id prompts on /v1/completions (what a remote Eclectus engine is sent) are graph calls
like text prompts: the scheduler's in-flight cap, app-FIFO between tenants and prompt limits
apply to them, their ids reach the engine exactly, and a client that leaves aborts them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from scripted_engine import FRONT, ScriptedEngine
from ws_helpers import ServerFactory

from eclectus.server.backend import EngineOutput, EngineRequest
from eclectus.server.front.app import EclectusServer

TENANTS = (("alice", "sk-alice"), ("bob", "sk-bob"))


class PeakEngine(ScriptedEngine):
    """A scripted engine that records the most requests it ever generated at once."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.peak = 0

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.peak = max(self.peak, len(self.running) + 1)
        async for output in super().generate(request):
            yield output


async def wait_for(condition: object, timeout: float = 5.0) -> None:
    """Poll ``condition()`` until it is true (the server runs on this loop)."""
    for _ in range(int(timeout / 0.01)):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def post(server: EclectusServer, body: dict, token: str = "sk-alice") -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=10, headers=headers) as http:
        return await http.post(f"{server.openai_url}/completions", json=body)


def ids_of(n: int, first: int = 1) -> list[int]:
    return list(range(first, first + n))


async def test_a_token_prompt_flood_stays_under_the_cap_and_in_app_fifo(
    make_server: ServerFactory,
) -> None:
    """Alice floods token-id requests (8 prompts each); bob sends one between them. The engine
    never holds more than max_inflight requests (before, every prompt went straight in);
    bob's call is dispatched before every call alice sent after him, and each request
    carries its own tenant and its exact ids."""
    engine = PeakEngine(hold=True)
    server = await make_server(engine, max_inflight=2, tenant_tokens=TENANTS)
    scheduler = server.scheduler
    flood = [ids_of(3, first=10 * r + p) for r in range(3) for p in range(8)]
    before = [
        asyncio.ensure_future(post(server, {"prompt": flood[8 * r : 8 * r + 8], "max_tokens": 4}))
        for r in range(2)
    ]
    await wait_for(lambda: len(scheduler.queue) == 14)
    bob = asyncio.ensure_future(post(server, {"prompt": [7, 8, 9], "max_tokens": 4}, "sk-bob"))
    await wait_for(lambda: len(scheduler.queue) == 15)
    after = asyncio.ensure_future(post(server, {"prompt": flood[16:], "max_tokens": 4}))
    await wait_for(lambda: len(scheduler.queue) == 23)
    assert len(engine.requests) == 2 and scheduler.num_inflight == 2
    engine.release()
    answers = [await a for a in (*before, bob, after)]
    assert [a.status_code for a in answers] == [200] * 4
    assert engine.peak <= 2 and len(engine.requests) == 25
    order = [request.tenant for request in engine.requests]
    assert order.index("bob") == 16  # after alice's 16 earlier calls, before her 8 later ones
    sent = {request.prompt_token_ids for request in engine.requests}
    assert sent == {tuple(ids) for ids in flood} | {(7, 8, 9)}
    choices = answers[2].json()["choices"]
    assert len(choices) == 1 and choices[0]["token_ids"] == list(choices[0]["text"].encode())
    assert scheduler.snapshot() == [] and scheduler.num_inflight == 0


async def test_token_prompt_limits_are_400s_naming_the_prompt(
    make_server: ServerFactory,
) -> None:
    """Too many prompts, a prompt over max_prompt_tokens, an empty prompt and a stream of two
    prompts are 400s with param ``prompt``; nothing is scheduled or reaches the engine."""
    engine = ScriptedEngine()
    server = await make_server(engine, max_prompts_per_request=4, max_prompt_tokens=16)
    cases = {
        "5 prompts, limit 4": {"prompt": [[1]] * 5},
        "prompt 1 has 17 tokens, limit 16": {"prompt": [[1], ids_of(17)]},
        "prompt 0 must not be empty": {"prompt": [[], [1]]},
        "streaming takes a single prompt": {"prompt": [[1], [2]], "stream": True},
    }
    for message, body in cases.items():
        answer = await post(server, {**body, "max_tokens": 2})
        assert answer.status_code == 400, (message, answer.text)
        error = answer.json()["error"]
        assert message in error["message"] and error["param"] == "prompt"
    assert engine.requests == [] and server.scheduler.snapshot() == []
    answer = await post(server, {"prompt": ids_of(16), "max_tokens": 2})  # at the limit
    assert answer.status_code == 200 and len(engine.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_aborts_its_token_prompt(
    make_server: ServerFactory, stream: bool
) -> None:
    """The client closes its socket while its token-id call is in the engine: the request is
    aborted and the app and its slot are gone."""
    engine = ScriptedEngine(hold=True)
    server = await make_server(engine)
    payload = json.dumps({"prompt": [5, 6, 7], "max_tokens": 4, "stream": stream}).encode()
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    await wait_for(lambda: len(engine.running) == 1)
    request_id = engine.requests[0].request_id
    writer.close()
    await wait_for(lambda: request_id in engine.aborted)
    await wait_for(lambda: engine.running == set() and server.scheduler.snapshot() == [])
    assert server.scheduler.num_inflight == 0


async def test_streamed_token_ids_concatenate_to_the_answer(make_server: ServerFactory) -> None:
    """A streamed token-id prompt lists each chunk's ids; together they are the generated
    ids, and return_token_ids does the same for a text prompt."""
    server = await make_server(ScriptedEngine())
    for prompt in ([3, 4], "text"):
        body = {"prompt": prompt, "max_tokens": 6, "stream": True, "return_token_ids": True}
        headers = {"Authorization": "Bearer x"}
        async with (
            httpx.AsyncClient(timeout=10, headers=headers) as http,
            http.stream("POST", f"{server.openai_url}/completions", json=body) as response,
        ):
            lines = [line async for line in response.aiter_lines()]
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
        assert ids == list(text.encode()) and len(ids) == 6
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_return_each_prompts_ids_on_its_choice(
    make_server: ServerFactory, stream: bool
) -> None:
    """return_token_ids on /v1/completions, as vLLM answers it: each choice carries its
    prompt's ids (``prompt_token_ids``; streamed, the first chunk's choice only), a
    token-id prompt its own ids; without it, no choice has them (a token-id prompt's
    generated ids still come back: Eclectus's remote engines continue from them)."""
    server = await make_server(ScriptedEngine())
    for text in [["ab", "xyz"]] if not stream else []:  # text prompts too
        async with httpx.AsyncClient(timeout=10, headers={"Authorization": "Bearer x"}) as http:
            reply = await http.post(
                f"{server.openai_url}/completions",
                json={"prompt": text, "max_tokens": 2, "return_token_ids": True},
            )
        got = [c["prompt_token_ids"] for c in reply.json()["choices"]]
        assert got == [FRONT.tokenizer.encode(t) for t in text]
    prompts: list[Any] = [[3, 4]] if stream else [[3, 4], [5], [6, 7, 8]]
    expected = prompts
    body = {"prompt": prompts[0] if stream else prompts, "max_tokens": 3, "stream": stream}
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": "Bearer x"}) as http:
        for with_ids in (False, True):
            async with http.stream(
                "POST",
                f"{server.openai_url}/completions",
                json={**body, "return_token_ids": with_ids},
            ) as response:
                assert response.status_code == 200
                if stream:
                    lines = [line async for line in response.aiter_lines()]
                    replies = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
                else:
                    replies = [json.loads(await response.aread())]
            choices = [c for r in replies for c in r["choices"]]
            found = [c["prompt_token_ids"] for c in choices if "prompt_token_ids" in c]
            assert found == (expected if with_ids else [])
            if with_ids and stream:
                assert "prompt_token_ids" in replies[0]["choices"][0]


async def _chat(server: EclectusServer, body: dict) -> list[dict]:
    """The chat answer (one item) or, streamed, its data events, parsed."""
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream("POST", f"{server.openai_url}/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        if not body.get("stream"):
            return [json.loads(await response.aread())]
        lines = [line async for line in response.aiter_lines()]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_returns_token_ids_under_vllms_names(
    make_server: ServerFactory, stream: bool
) -> None:
    """return_token_ids on /v1/chat/completions, as vLLM answers it: the choice's generated
    ids (streamed: each chunk's, concatenating to the answer) in ``token_ids``, the rendered
    prompt's in ``prompt_token_ids`` (streamed: on the first chunk); without it, neither."""
    engine = ScriptedEngine()
    server = await make_server(engine)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": stream}
    plain = await _chat(server, body)
    assert not any("token_ids" in c["choices"][0] for c in plain if c["choices"])
    assert not any("prompt_token_ids" in c for c in plain)
    events = await _chat(server, {**body, "return_token_ids": True})
    (prompt,) = {r.prompt_token_ids for r in engine.requests}  # the same rendering twice
    # the rendered chat, tokenized with no special token added (as vLLM's chat endpoint)
    rendered = FRONT.render_chat(body["messages"])
    assert list(prompt) == FRONT.tokenizer.encode(rendered, add_special_tokens=False)
    assert events[0]["prompt_token_ids"] == list(prompt)
    assert not any("prompt_token_ids" in e for e in events[1:])
    if stream:
        content = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
        ids = [i for e in events[1:] for i in e["choices"][0]["token_ids"]]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    else:
        (choice,) = events[0]["choices"]
        content, ids = choice["message"]["content"], choice["token_ids"]
    assert ids == list(content.encode()) and len(ids) == 6
