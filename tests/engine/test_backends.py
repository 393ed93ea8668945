"""Both built-in engines behind the Backend contract, one fixture over both: AsyncEngine (the
core on a thread) and ProcessEngine (the core in a child process) stream, abort, pin, refuse
and isolate failures alike. What only one of them has lives in test_async_engine.py (failures
injected into the in-process engine) and test_process_engine.py (the core's own process)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from engine_helpers import (
    CONFIG,
    TOKENIZER,
    Engine,
    collect,
    prompt_request,
    request,
    wait_until_idle,
)

from eclectus.models.tokenizer import Tokenizer
from eclectus.server.backend import (
    EngineError,
    EngineOutput,
    RequestRefused,
    check_constraint,
)
from eclectus.server.engine import AsyncEngine, ProcessEngine, SamplingParams

BACKENDS = {"thread": AsyncEngine, "process": ProcessEngine}


@pytest.fixture(scope="module", params=list(BACKENDS))
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    built = BACKENDS[request.param](CONFIG)
    yield built
    asyncio.run(built.shutdown())


def tokenizer_of(engine: Engine) -> Tokenizer:
    """The tokenizer the engine decodes with: its own (in-process) or the tiny one (its core
    is another process, with the same files)."""
    return TOKENIZER if isinstance(engine, ProcessEngine) else engine.engine.tokenizer


async def test_concurrent_streams_match_and_deltas_add_up(engine: Engine) -> None:
    prompts = [("Alpha. ",), ("Beta beta. ",), ("Alpha. ", "Gamma?"), ("Delta " * 20,)]
    reqs = [request(f"c{i}", *p, max_tokens=12, ignore_eos=True) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    solo = await collect(engine, request("c-solo", *prompts[3], max_tokens=12, ignore_eos=True))
    for outs in results:
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert sum(len(o.token_ids) for o in outs) == 12 == outs[-1].num_output_tokens
    ids = [t for o in results[3] for t in o.token_ids]
    assert ids == [t for o in solo for t in o.token_ids]  # batching changes nothing
    assert "".join(o.text for o in results[3]) == tokenizer_of(engine).decode(ids)
    await wait_until_idle(engine)


async def test_stats_count_what_the_outputs_say(engine: Engine) -> None:
    before = engine.stats()
    outs = await collect(engine, request("s0", "Count. ", max_tokens=6, ignore_eos=True))
    after = engine.stats()
    assert after.generated_tokens - before.generated_tokens == 6 == outs[-1].num_output_tokens
    assert after.extra["num_steps"] - before.extra["num_steps"] >= 6


async def test_stop_string_never_leaks(engine: Engine) -> None:
    story = request("s1", "Once upon a time ", max_tokens=24, ignore_eos=True)
    full = "".join(o.text for o in await collect(engine, story))
    assert len(full) > 6
    stop = full[3:6]
    outs = await collect(
        engine, request("s2", "Once upon a time ", max_tokens=24, ignore_eos=True, stop=(stop,))
    )
    assert outs[-1].finish_reason == "stop"
    assert "".join(o.text for o in outs) == full[: full.index(stop)]
    assert all(stop not in o.text for o in outs)


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


async def test_abort_by_call_ends_the_stream(engine: Engine) -> None:
    outs: list[EngineOutput] = []

    async def consume() -> None:
        async for out in engine.generate(
            request("a1", "Another story. ", max_tokens=500, ignore_eos=True)
        ):
            outs.append(out)
            if len(outs) == 2:
                await engine.abort("a1")

    await asyncio.wait_for(consume(), timeout=30)
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert outs[-1].num_output_tokens < 500
    await wait_until_idle(engine)


async def test_pin_holds_prefix_until_unpin(engine: Engine) -> None:
    system = "You are a careful assistant who answers briefly. " * 2
    sampling = SamplingParams(max_tokens=4)
    await collect(engine, prompt_request("p0", (system, "Q1?"), sampling, pin_segments=1))
    await wait_until_idle(engine, num_pinned=1)
    outs = await collect(engine, prompt_request("p1", (system, "Q2?"), sampling))
    assert outs[-1].num_cached_tokens >= len(TOKENIZER.encode(system)) // 16 * 16 > 0
    await engine.unpin("p0")
    await wait_until_idle(engine, num_pinned=0)


async def test_duplicate_and_invalid_requests_raise(engine: Engine) -> None:
    with pytest.raises(EngineError, match="context window"):
        await collect(engine, request("e0", "x" * 5000))
    long = engine.generate(request("e1", "Go on. ", max_tokens=400, ignore_eos=True))
    await long.__anext__()
    with pytest.raises(EngineError, match="already running"):
        await collect(engine, request("e1"))
    await long.aclose()
    await wait_until_idle(engine)
    assert engine.max_model_len == 4096


async def test_uncompilable_constraint_is_refused(engine: Engine) -> None:
    """check_constraint and generate both raise RequestRefused (bad_request); nothing runs."""
    sampling = SamplingParams(max_tokens=8, structured_outputs={"regex": r"(a)\1"})
    with pytest.raises(RequestRefused, match="Backreference") as caught:
        await asyncio.to_thread(check_constraint, engine, sampling)
    assert caught.value.code == "bad_request"
    with pytest.raises(RequestRefused, match="Backreference"):
        await collect(engine, prompt_request("r0", ("Say:",), sampling))
    assert engine.stats().num_running == engine.stats().num_waiting == 0


async def test_one_requests_parameters_never_fail_a_neighbours_stream(engine: Engine) -> None:
    """Bad engine-side params (no wire validation in front): a temperature the sampler
    cannot hold and a seed torch refuses fail their own request only; a concurrent stream
    of another session completes."""
    good = asyncio.create_task(collect(engine, request("iso-good", max_tokens=24)))
    await asyncio.sleep(0.05)  # the good stream is decoding when the bad ones arrive
    unchecked = SamplingParams.model_construct  # the engine's params, no bounds checked
    bad_temp = prompt_request("iso-temp", ("Hi. ",), unchecked(max_tokens=8, temperature=2**1100))
    bad_seed = prompt_request(
        "iso-seed", ("Hi. ",), unchecked(max_tokens=8, temperature=0.7, seed=2**80)
    )
    for bad in (bad_temp, bad_seed):
        with pytest.raises(EngineError):
            await collect(engine, bad)
    outs = await good
    assert outs[-1].finish_reason in ("stop", "length")
    assert sum(len(o.token_ids) for o in outs) == outs[-1].num_output_tokens
    await wait_until_idle(engine)


@pytest.mark.parametrize("backend", list(BACKENDS))
async def test_shutdown_ends_open_streams_with_abort(backend: str) -> None:
    engine = BACKENDS[backend](CONFIG)
    gen = engine.generate(request("z0", "Keep going. ", max_tokens=2000, ignore_eos=True))
    await gen.__anext__()
    await engine.shutdown()
    rest = [out async for out in gen]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    with pytest.raises(EngineError, match="shut down"):
        await collect(engine, request("z1"))
    await engine.shutdown()  # idempotent
