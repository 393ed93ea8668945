"""Both built-in engines behind the Backend contract, one fixture over both: AsyncEngine (the
core on a thread) and ProcessEngine (the core in a child process) stream, abort, pin and
refuse alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from eclectus.server.backend import EngineOutput, EngineRequest
from eclectus.server.engine import AsyncEngine, EngineConfig, ProcessEngine, SamplingParams

CONFIG = EngineConfig(model="tiny", num_kv_blocks=256)
Engine = AsyncEngine | ProcessEngine


@pytest.fixture(scope="module", params=["thread", "process"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    built: Engine = AsyncEngine(CONFIG) if request.param == "thread" else ProcessEngine(CONFIG)
    yield built
    asyncio.run(built.shutdown())


def request(request_id: str, *segments: str, **sampling: object) -> EngineRequest:
    return EngineRequest(
        request_id, segments or ("Hello there. ",), SamplingParams(**{"max_tokens": 8, **sampling})
    )


async def collect(engine: Engine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


async def wait_until_idle(engine: Engine, num_pinned: int = 0) -> None:
    for _ in range(300):
        stats = engine.stats()
        if (
            stats.num_running == 0
            and stats.num_waiting == 0
            and stats.extra["num_pinned"] == num_pinned
            and (num_pinned or stats.num_free_blocks == stats.num_total_blocks)
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not go idle: {engine.stats()}")


async def test_closing_the_stream_early_aborts_at_once(engine: Engine) -> None:
    """``aclose`` itself sends the abort: with the event loop blocked right after it (no
    callback of ours can run), the engine still stops stepping the request."""
    before = engine.stats().generated_tokens
    gen = engine.generate(request("x0", "Tell me a long story. ", max_tokens=2000, ignore_eos=True))
    assert not (await gen.__anext__()).finished
    await gen.aclose()
    time.sleep(0.5)  # the loop is blocked: an abort left to a loop callback would wait
    await wait_until_idle(engine)
    # a few tokens before the close, at most one step after it; an abort that waited for the
    # loop would let the request decode for the whole half second (~370 tokens here)
    assert engine.stats().generated_tokens - before < 32
