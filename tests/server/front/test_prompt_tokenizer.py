"""Prompts are tokenized once, off the event loop when long, in the order they come: the
loop keeps serving while a burst of long prompts is tokenized (prompt_tokenizer.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import httpx
from scripted_engine import FRONT, ScriptedEngine, prompt_text
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.server.front.prompt import Front, Prompt
from eclectus.server.front.prompt_tokenizer import INLINE_MAX_CHARS, PromptTokenizer

LONG = "x" * (INLINE_MAX_CHARS + 1)


class GatedFront(Front):
    """The tiny front, but ``encode`` waits for ``gate`` on long prompts and records which
    thread encoded which prompt, and whether with special tokens."""

    def __init__(self) -> None:
        super().__init__("tiny", FRONT.tokenizer)
        self.gate = threading.Event()
        self.tokenized: list[tuple[str, bool, str]] = []  # (prompt, special, thread name)

    def encode(self, segments: Sequence[str], add_special_tokens: bool = True) -> Prompt:
        prompt = "".join(segments)
        if len(prompt) > INLINE_MAX_CHARS:
            assert self.gate.wait(10), "the test never opened the gate"
        self.tokenized.append((prompt, add_special_tokens, threading.current_thread().name))
        return super().encode(segments, add_special_tokens)


def ids(text: str, add_special_tokens: bool = True) -> list[int]:
    return FRONT.tokenizer.encode(text, add_special_tokens)


async def test_a_short_prompt_is_tokenized_inline_when_the_worker_is_idle() -> None:
    """No thread hop for a short prompt with nothing queued ahead of it."""
    front = GatedFront()
    tokenizer = PromptTokenizer(front)
    prompt = await tokenizer.tokenize_prompt(("short",))
    assert list(prompt.token_ids) == ids("short")
    assert front.tokenized == [("short", True, threading.current_thread().name)]
    assert tokenizer.num_offloaded == 0


async def test_prompts_are_tokenized_in_the_order_they_come() -> None:
    """Long prompts go to the worker thread; a short one that comes while they are pending
    goes behind them, so prompts reach the engine in arrival order."""
    front = GatedFront()
    tokenizer = PromptTokenizer(front)
    prompts = [LONG + "a", LONG + "b", "short"]
    done: list[str] = []

    async def tokenize(prompt: str) -> None:
        await tokenizer.tokenize_prompt((prompt,))
        done.append(prompt)

    tasks = [asyncio.create_task(tokenize(p)) for p in prompts]
    await asyncio.sleep(0.05)
    assert done == []  # the worker is held on the first long prompt; nothing overtook it
    front.gate.set()
    await asyncio.gather(*tasks)
    tokenizer.close()
    assert done == prompts
    assert [name for _, _, name in front.tokenized] == ["eclectus-tokenize_0"] * 3
    assert tokenizer.num_offloaded == 3


async def test_the_loop_serves_while_a_burst_of_long_prompts_is_tokenized(
    make_server: ServerFactory,
) -> None:
    """Eight long /v1 prompts held in tokenization: /healthz still answers (the loop is
    free); once released, every prompt is answered, each tokenized exactly once (never again
    at dispatch, never counted for the size check) on the worker thread."""
    engine, front = ScriptedEngine(), GatedFront()
    server = await make_server(engine, front=front)
    prompts = [f"{LONG} prompt {i}" for i in range(8)]
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        body = {"model": "tiny", "max_tokens": 4}
        posts = [
            asyncio.create_task(http.post("/v1/completions", json={**body, "prompt": p}))
            for p in prompts
        ]
        await asyncio.sleep(0.1)
        health = await http.get("/healthz")
        assert health.status_code == 200
        assert engine.requests == []  # nothing reached the engine: all held in tokenization
        front.gate.set()
        answers = await asyncio.gather(*posts)
    assert [a.status_code for a in answers] == [200] * 8
    assert sorted(p for p, _, _ in front.tokenized) == sorted(prompts)  # each once
    assert {name for _, _, name in front.tokenized} == {"eclectus-tokenize_0"}
    sent = {prompt_text(r): list(r.prompt_token_ids) for r in engine.requests}
    assert sent == {p: ids(p) for p in prompts}


async def test_a_draining_server_waits_for_prompts_still_being_tokenized(
    make_server: ServerFactory,
) -> None:
    """A request admitted before a drain but still in tokenization counts as work in flight:
    the drain waits for it and it is answered, not lost between arrival and the scheduler."""
    engine, front = ScriptedEngine(), GatedFront()
    server = await make_server(engine, front=front)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        body = {"model": "tiny", "max_tokens": 4, "prompt": LONG}
        post = asyncio.create_task(http.post("/v1/completions", json=body))
        await asyncio.sleep(0.1)
        assert server.busy()
        drain = asyncio.create_task(server.drain(timeout_s=10))
        await asyncio.sleep(0.1)
        assert not drain.done()
        front.gate.set()
        answer = await post
        await drain
    assert answer.status_code == 200
    assert [list(r.prompt_token_ids) for r in engine.requests] == [ids(LONG)]


async def test_tokenize_endpoint_encodes_a_long_prompt_off_the_loop(
    make_server: ServerFactory,
) -> None:
    """vLLM's ``POST /tokenize`` with a long prompt, both forms, held in encoding: /healthz
    still answers; once released, both answer the prompt's ids, encoded on the worker."""
    front = GatedFront()
    server = await make_server(front=front)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        forms = [{"prompt": LONG}, {"prompt": LONG + "!", "add_special_tokens": False}]
        posts = [asyncio.create_task(http.post("/tokenize", json=form)) for form in forms]
        await asyncio.sleep(0.1)
        assert (await http.get("/healthz")).status_code == 200
        assert not any(post.done() for post in posts)
        front.gate.set()
        answers = [(await post).json() for post in posts]
    assert answers[0]["tokens"] == ids(LONG)
    assert answers[1]["tokens"] == ids(LONG + "!", False)
    assert answers[1]["count"] == len(ids(LONG + "!", False))
    worker = "eclectus-tokenize_0"
    assert front.tokenized == [(LONG, True, worker), (LONG + "!", False, worker)]


async def test_a_tokenize_frame_encodes_a_long_text_off_the_loop(
    make_server: ServerFactory,
) -> None:
    """A WebSocket ``tokenize`` frame with a long text, held in encoding: another session
    still opens; once released, the frame is answered with the ids, and a short text sent
    meanwhile (queued behind it, in arrival order) is answered too."""
    front = GatedFront()
    server = await make_server(front=front)
    async with connect(server.url) as ws, connect(server.url) as ws2:
        held, other = RawClient(ws), RawClient(ws2)
        await held.hello()
        await held.send({"type": "tokenize", "id": "long", "text": LONG})
        await asyncio.sleep(0.1)
        await other.hello()  # the loop is free while the long text is encoded
        await other.send({"type": "tokenize", "id": "short", "text": "abc"})
        front.gate.set()
        answer = await held.recv(timeout=10)
        reply = await other.recv(timeout=10)
    assert answer["type"] == "tokens" and answer["ids"] == ids(LONG, False)
    abc = ids("abc", False)
    assert reply == {"type": "tokens", "id": "short", "count": len(abc), "ids": abc}
