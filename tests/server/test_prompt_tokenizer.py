"""Prompts are tokenized once, off the event loop when long, in the order they come: the
loop keeps serving while a burst of long prompts is tokenized (prompt_tokenizer.py)."""

from __future__ import annotations

import asyncio
import threading

import httpx
from scripted_engine import ScriptedEngine
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.server.backend import TokenizedPrompt
from eclectus.server.prompt_tokenizer import INLINE_MAX_CHARS, PromptTokenizer

LONG = "x" * (INLINE_MAX_CHARS + 1)


class GatedTokenizing(ScriptedEngine):
    """A scripted engine whose ``tokenize_prompt`` waits for ``gate`` on long prompts and
    records which thread tokenized which prompt; ``tokenize`` (a count) is recorded too."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.tokenized: list[tuple[str, str]] = []  # (prompt, thread name), in call order
        self.counted: list[str] = []

    def tokenize(self, text: str) -> list[int]:
        if len(text) > INLINE_MAX_CHARS:
            assert self.gate.wait(10), "the test never opened the gate"
        self.counted.append(text)
        return super().tokenize(text)

    def tokenize_prompt(self, segments: tuple[str, ...]) -> TokenizedPrompt:
        prompt = "".join(segments)
        if len(prompt) > INLINE_MAX_CHARS:
            assert self.gate.wait(10), "the test never opened the gate"
        self.tokenized.append((prompt, threading.current_thread().name))
        return super().tokenize_prompt(segments)


async def test_a_short_prompt_is_tokenized_inline_when_the_worker_is_idle() -> None:
    """No thread hop for a short prompt with nothing queued ahead of it."""
    engine = GatedTokenizing()
    tokenizer = PromptTokenizer(engine)
    prompt = await tokenizer.tokenize_prompt(("short",))
    assert prompt.token_ids == tuple(b"short")
    assert engine.tokenized == [("short", threading.current_thread().name)]
    assert tokenizer.num_offloaded == 0


async def test_prompts_are_tokenized_in_the_order_they_come() -> None:
    """Long prompts go to the worker thread; a short one that comes while they are pending
    goes behind them, so prompts reach the engine in arrival order."""
    engine = GatedTokenizing()
    tokenizer = PromptTokenizer(engine)
    prompts = [LONG + "a", LONG + "b", "short"]
    done: list[str] = []

    async def tokenize(prompt: str) -> None:
        await tokenizer.tokenize_prompt((prompt,))
        done.append(prompt)

    tasks = [asyncio.create_task(tokenize(p)) for p in prompts]
    await asyncio.sleep(0.05)
    assert done == []  # the worker is held on the first long prompt; nothing overtook it
    engine.gate.set()
    await asyncio.gather(*tasks)
    tokenizer.close()
    assert done == prompts
    assert [name for _, name in engine.tokenized] == ["eclectus-tokenize_0"] * 3
    assert tokenizer.num_offloaded == 3


async def test_the_loop_serves_while_a_burst_of_long_prompts_is_tokenized(
    make_server: ServerFactory,
) -> None:
    """Eight long /v1 prompts held in tokenization: /healthz still answers (the loop is
    free); once released, every prompt is answered, each tokenized exactly once (never again
    at dispatch, never counted for the size check) on the worker thread."""
    engine = GatedTokenizing()
    server = await make_server(engine)
    prompts = [f"{LONG} prompt {i}" for i in range(8)]
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        body = {"model": "scripted", "max_tokens": 4}
        posts = [
            asyncio.create_task(http.post("/v1/completions", json={**body, "prompt": p}))
            for p in prompts
        ]
        await asyncio.sleep(0.1)
        health = await http.get("/healthz")
        assert health.status_code == 200
        assert engine.requests == []  # nothing reached the engine: all held in tokenization
        engine.gate.set()
        answers = await asyncio.gather(*posts)
    assert [a.status_code for a in answers] == [200] * 8
    assert sorted(p for p, _ in engine.tokenized) == sorted(prompts)
    assert {name for _, name in engine.tokenized} == {"eclectus-tokenize_0"}
    assert engine.counted == []
    sent = {r.segments[0]: r.tokens for r in engine.requests}
    assert {p: t.token_ids if t else None for p, t in sent.items()} == {
        p: tuple(p.encode()) for p in prompts
    }


async def test_a_draining_server_waits_for_prompts_still_being_tokenized(
    make_server: ServerFactory,
) -> None:
    """A request admitted before a drain but still in tokenization counts as work in flight:
    the drain waits for it and it is answered, not lost between arrival and the scheduler."""
    engine = GatedTokenizing()
    server = await make_server(engine)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        body = {"model": "scripted", "max_tokens": 4, "prompt": LONG}
        post = asyncio.create_task(http.post("/v1/completions", json=body))
        await asyncio.sleep(0.1)
        assert server.busy()
        drain = asyncio.create_task(server.drain(timeout_s=10))
        await asyncio.sleep(0.1)
        assert not drain.done()
        engine.gate.set()
        answer = await post
        await drain
    assert answer.status_code == 200
    assert [r.segments for r in engine.requests] == [(LONG,)]


async def test_tokenize_endpoint_encodes_a_long_prompt_off_the_loop(
    make_server: ServerFactory,
) -> None:
    """vLLM's ``POST /tokenize`` with a long prompt, both forms, held in encoding: /healthz
    still answers; once released, both answer the prompt's ids, encoded on the worker."""
    engine = GatedTokenizing()
    server = await make_server(engine)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        forms = [{"prompt": LONG}, {"prompt": LONG + "!", "add_special_tokens": False}]
        posts = [asyncio.create_task(http.post("/tokenize", json=form)) for form in forms]
        await asyncio.sleep(0.1)
        assert (await http.get("/healthz")).status_code == 200
        assert not any(post.done() for post in posts)
        engine.gate.set()
        answers = [(await post).json() for post in posts]
    assert answers[0]["tokens"] == list(LONG.encode())
    assert answers[1]["tokens"] == list((LONG + "!").encode())
    assert answers[1]["count"] == len(LONG) + 1
    assert engine.tokenized == [(LONG, "eclectus-tokenize_0")]
    assert engine.counted == [LONG + "!"]


async def test_a_tokenize_frame_encodes_a_long_text_off_the_loop(
    make_server: ServerFactory,
) -> None:
    """A WebSocket ``tokenize`` frame with a long text, held in encoding: another session
    still opens; once released, the frame is answered with the ids, and a short text sent
    meanwhile (queued behind it, in arrival order) is answered too."""
    engine = GatedTokenizing()
    server = await make_server(engine)
    async with connect(server.url) as ws, connect(server.url) as ws2:
        held, other = RawClient(ws), RawClient(ws2)
        await held.hello()
        await held.send({"type": "tokenize", "id": "long", "text": LONG})
        await asyncio.sleep(0.1)
        await other.hello()  # the loop is free while the long text is encoded
        await other.send({"type": "tokenize", "id": "short", "text": "abc"})
        engine.gate.set()
        answer = await held.recv(timeout=10)
        reply = await other.recv(timeout=10)
    assert answer["type"] == "tokens" and answer["ids"] == list(LONG.encode())
    assert reply == {"type": "tokens", "id": "short", "count": 3, "ids": list(b"abc")}
