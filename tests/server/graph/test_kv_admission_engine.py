"""No thrash on the built-in engine: a burst of long prompts on a small KV pool makes the
engine preempt and recompute when everything is sent at once (``--admission off``), and
never when admission reserves each request's KV first."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server
from eclectus.server.front.prompt import Front

pytestmark = pytest.mark.slow

NUM_PROMPTS = 8


def burst_frame() -> dict:
    """Eight long prompts, each writing 48 tokens whatever it says."""
    calls = [
        {
            "id": f"c{i}",
            "segments": [
                {"text": f"Report {i}: " + " ".join(f"word{i}x{j}" for j in range(40))},
                {"gen": f"v{i}", "sampling": {"max_tokens": 48, "ignore_eos": True}},
            ],
        }
        for i in range(NUM_PROMPTS)
    ]
    gets = [{"var": f"v{i}"} for i in range(NUM_PROMPTS)]
    return {"type": "submit", "id": "s", "calls": calls, "gets": gets}


async def burst(admission: str) -> tuple[int, dict[str, str]]:
    """The engine's preemptions after the burst, and the answers."""
    from eclectus.server.engine import AsyncEngine

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=40, block_size=16)
    config = ServerConfig(port=0, admission=admission)
    async with await start_server(config, engine, owns_backend=True) as server:
        async with connect(server.url) as ws:
            client = RawClient(ws)
            await client.hello()
            assert (await client.ask(burst_frame()))["type"] == "ack"
            answers = await asyncio.wait_for(client.values(NUM_PROMPTS), 120)
        return engine.stats().num_preemptions, {v: a.get("text", "") for v, a in answers.items()}


async def test_kv_admission_keeps_a_burst_of_long_prompts_from_preempting() -> None:
    preempted_off, texts_off = await burst("off")
    preempted_on, texts_on = await burst("engine")
    assert preempted_off > 0  # the burst does thrash when sent at once
    assert preempted_on == 0
    assert texts_on == texts_off  # greedy: the same answers either way


def shared_preamble_frame() -> dict:
    """Eight prompts over one long preamble, each with its own question, writing 24 tokens."""
    preamble = "Notes: " + " ".join(f"harbor{j}" for j in range(40)) + "\n"
    calls = [
        {
            "id": f"c{i}",
            "segments": [
                {"text": preamble + f"Question {i}: what about boat {i}?"},
                {"gen": f"v{i}", "sampling": {"max_tokens": 24, "ignore_eos": True}},
            ],
        }
        for i in range(NUM_PROMPTS)
    ]
    gets = [{"var": f"v{i}"} for i in range(NUM_PROMPTS)]
    return {"type": "submit", "id": "s", "calls": calls, "gets": gets}


async def test_a_shared_preamble_is_reserved_once_and_still_never_preempts() -> None:
    """Eight prompts sharing a preamble on a pool that holds about two of them counted
    whole: admission counts the preamble's blocks once, as the engine's prefix cache holds
    them, so more run at once, and the engine still never preempts."""
    from eclectus.server.engine import AsyncEngine

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=40, block_size=16)
    async with await start_server(ServerConfig(port=0), engine, owns_backend=True) as server:
        frame = shared_preamble_frame()
        prompt = frame["calls"][0]["segments"][0]["text"]
        whole = len(Front.load("tiny").encode([prompt])) + 24
        assert 2 * whole <= 40 * 16 * 0.95 < 3 * whole  # two fit when counted whole
        most = 0
        async with connect(server.url) as ws:
            client = RawClient(ws)
            await client.hello()
            assert (await client.ask(frame))["type"] == "ack"
            answers = asyncio.ensure_future(client.values(NUM_PROMPTS))
            while not answers.done():
                most = max(most, server.scheduler.num_inflight)
                await asyncio.sleep(0.001)
            assert len(await asyncio.wait_for(answers, 120)) == NUM_PROMPTS
        assert most > 2
        assert engine.stats().num_preemptions == 0
