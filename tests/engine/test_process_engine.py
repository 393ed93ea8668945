"""ProcessEngine: the engine core in its own process behaves as the in-process AsyncEngine
(same requests, same tokens), and a core that dies fails what is open and nothing else. What
both engines share is tested over both in test_backends.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator

import pytest
from engine_helpers import CONFIG, collect, request, wait_until_idle

from eclectus.server.backend import EngineError, check_constraint
from eclectus.server.engine import AsyncEngine, EngineConfig, ProcessEngine, SamplingParams


@pytest.fixture(scope="module")
def local() -> Iterator[AsyncEngine]:
    engine = AsyncEngine(CONFIG)
    yield engine
    asyncio.run(engine.shutdown())


@pytest.fixture(scope="module")
def remote() -> Iterator[ProcessEngine]:
    engine = ProcessEngine(CONFIG)
    yield engine
    asyncio.run(engine.shutdown())


STORY = "Once upon a time there was a small robot who liked to count. "
REQUESTS = [
    request("d0", STORY, max_tokens=24, ignore_eos=True),
    request("d1", STORY, "It counted", max_tokens=16, ignore_eos=True),  # shares STORY's KV
    request("d2", "Alpha beta. ", max_tokens=12),
    request("d3", "Tell me more. ", max_tokens=20, temperature=0.8, seed=7),
    request("d4", STORY, max_tokens=24, ignore_eos=True, stop=(" the",)),
]


async def test_same_requests_same_outputs_as_the_in_process_engine(
    local: AsyncEngine, remote: ProcessEngine
) -> None:
    """Greedy and seeded requests, run concurrently: token ids, text and finish reasons are
    those of AsyncEngine, output by output."""
    ours = await asyncio.gather(*(collect(remote, r) for r in REQUESTS))
    theirs = await asyncio.gather(*(collect(local, r) for r in REQUESTS))
    for mine, expected in zip(ours, theirs, strict=True):
        assert [t for o in mine for t in o.token_ids] == [t for o in expected for t in o.token_ids]
        assert "".join(o.text for o in mine) == "".join(o.text for o in expected)
        assert mine[-1].finish_reason == expected[-1].finish_reason
        assert mine[-1].num_output_tokens == expected[-1].num_output_tokens
    await wait_until_idle(remote)


async def test_both_report_the_same_window(local: AsyncEngine, remote: ProcessEngine) -> None:
    assert remote.max_model_len == local.max_model_len == 4096


async def test_a_cache_reset_reaches_the_core_before_the_next_request(
    local: AsyncEngine, remote: ProcessEngine
) -> None:
    """Both engines: the same prompt hits the cache, and after ``reset_prefix_cache`` (one
    command, applied in order before the next request) it is computed again."""
    prompt = STORY * 4
    for engine in (local, remote):
        await collect(engine, request("warm", prompt, max_tokens=2))
        hit = await collect(engine, request("hit", prompt, max_tokens=2))
        await engine.reset_prefix_cache()
        cold = await collect(engine, request("cold", prompt, max_tokens=2))
        assert hit[-1].num_cached_tokens > 0 and cold[-1].num_cached_tokens == 0
        await wait_until_idle(engine)


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


async def test_structured_output_as_in_process(local: AsyncEngine, remote: ProcessEngine) -> None:
    """The core compiles the grammar and constrains sampling: valid JSON, the same tokens as
    the in-process engine's."""
    req = request("j0", "A person: ", max_tokens=48, structured_outputs={"json": SCHEMA})
    await asyncio.to_thread(check_constraint, remote, req.sampling)  # compiles: no refusal
    ours, theirs = await collect(remote, req), await collect(local, req)
    text = "".join(o.text for o in ours)
    assert set(json.loads(text)) == {"name", "age"}
    assert text == "".join(o.text for o in theirs)


async def test_a_killed_core_fails_open_requests_and_later_calls() -> None:
    engine = ProcessEngine(CONFIG)
    gen = engine.generate(request("k0", "Keep going. ", max_tokens=2000, ignore_eos=True))
    await gen.__anext__()
    os.kill(engine.pid, signal.SIGKILL)
    with pytest.raises(EngineError, match="exited"):
        async for _ in gen:
            pass
    with pytest.raises(EngineError, match="exited"):
        await collect(engine, request("k1"))
    sampling = SamplingParams(max_tokens=8, structured_outputs={"json": SCHEMA})
    with pytest.raises(EngineError, match="exited"):
        await asyncio.to_thread(check_constraint, engine, sampling)
    await engine.shutdown()  # still clean


async def test_shutdown_stops_the_core_process() -> None:
    engine = ProcessEngine(CONFIG)
    await engine.shutdown()
    assert engine.exit_code is not None  # no orphan


def test_a_model_that_cannot_be_found_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no-such-model"):
        ProcessEngine(EngineConfig(model="no-such-model"))
