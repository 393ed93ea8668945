"""ProcessEngine: the engine core in its own process behaves as the in-process AsyncEngine
(same requests, same tokens), and a core that dies fails what is open and nothing else."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator

import pytest

from eclectus.server.backend import (
    EngineError,
    EngineOutput,
    EngineRequest,
    RequestRefused,
    check_constraint,
)
from eclectus.server.engine import AsyncEngine, EngineConfig, ProcessEngine, SamplingParams

CONFIG = EngineConfig(model="tiny", num_kv_blocks=256)


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


def request(request_id: str, *segments: str, **sampling: object) -> EngineRequest:
    return EngineRequest(
        request_id, segments or ("Hello there. ",), SamplingParams(**{"max_tokens": 8, **sampling})
    )


async def collect(engine: AsyncEngine | ProcessEngine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


async def wait_until_idle(engine: ProcessEngine, num_pinned: int = 0) -> None:
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


async def test_front_tokenizes_as_the_engine(local: AsyncEngine, remote: ProcessEngine) -> None:
    segments = ("System prompt. ", "User: hi")
    assert remote.tokenize_prompt(segments) == local.tokenize_prompt(segments)
    assert remote.tokenize(" the") == local.tokenize(" the")
    assert remote.model == local.model


async def test_stats_count_what_the_outputs_say(remote: ProcessEngine) -> None:
    before = remote.stats().generated_tokens
    outs = await collect(remote, request("s0", "Count. ", max_tokens=6, ignore_eos=True))
    assert remote.stats().generated_tokens - before == 6 == outs[-1].num_output_tokens
    assert remote.stats().extra["num_steps"] >= 6


async def test_abort_by_closing_and_by_call(remote: ProcessEngine) -> None:
    gen = remote.generate(request("a0", "Tell me a long story. ", max_tokens=500, ignore_eos=True))
    assert not (await gen.__anext__()).finished
    await gen.aclose()  # closing early aborts
    await wait_until_idle(remote)
    outs: list[EngineOutput] = []
    async for out in remote.generate(request("a1", "Another. ", max_tokens=500, ignore_eos=True)):
        outs.append(out)
        if len(outs) == 2:
            await remote.abort("a1")
    assert outs[-1].finish_reason == "abort" and outs[-1].num_output_tokens < 500
    await wait_until_idle(remote)


async def test_pin_holds_prefix_until_unpin(remote: ProcessEngine) -> None:
    system = "You are a careful assistant who answers briefly. " * 2
    req = EngineRequest("p0", (system, "Q1?"), SamplingParams(max_tokens=4), pin_prefix_segments=1)
    await collect(remote, req)
    await wait_until_idle(remote, num_pinned=1)
    outs = await collect(remote, EngineRequest("p1", (system, "Q2?"), SamplingParams(max_tokens=4)))
    assert outs[-1].num_cached_tokens >= len(remote.tokenize(system)) // 16 * 16 > 0
    await remote.unpin("p0")
    await wait_until_idle(remote, num_pinned=0)


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


async def test_uncompilable_constraint_is_refused(remote: ProcessEngine) -> None:
    """check_constraint and generate both raise RequestRefused (bad_request); nothing runs."""
    sampling = SamplingParams(max_tokens=8, structured_outputs={"regex": r"(a)\1"})
    with pytest.raises(RequestRefused, match="Backreference") as caught:
        await asyncio.to_thread(check_constraint, remote, sampling)
    assert caught.value.code == "bad_request"
    with pytest.raises(RequestRefused, match="Backreference"):
        await collect(remote, EngineRequest("r0", ("Say:",), sampling))
    assert remote.stats().num_running == remote.stats().num_waiting == 0


async def test_duplicate_and_invalid_requests_raise(remote: ProcessEngine) -> None:
    with pytest.raises(EngineError, match="context window"):
        await collect(remote, request("e0", "x" * 5000))
    long = remote.generate(request("e1", "Go on. ", max_tokens=400, ignore_eos=True))
    await long.__anext__()
    with pytest.raises(EngineError, match="already running"):
        await collect(remote, request("e1"))
    await long.aclose()
    await wait_until_idle(remote)


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


async def test_shutdown_ends_open_streams_with_abort_and_the_process() -> None:
    engine = ProcessEngine(CONFIG)
    gen = engine.generate(request("z0", "Keep going. ", max_tokens=2000, ignore_eos=True))
    await gen.__anext__()
    await engine.shutdown()
    rest = [out async for out in gen]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert engine.exit_code is not None  # no orphan
    with pytest.raises(EngineError, match="shut down"):
        await collect(engine, request("z1"))
    await engine.shutdown()  # idempotent


def test_a_model_that_cannot_be_found_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no-such-model"):
        ProcessEngine(EngineConfig(model="no-such-model"))
