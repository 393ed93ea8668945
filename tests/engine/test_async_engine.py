"""AsyncEngine: concurrent streams, aborts, pins, stop strings, and failure isolation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from eclectus.server.backend import EngineError, EngineOutput, EngineRequest
from eclectus.server.engine import AsyncEngine, EngineConfig, SamplingParams

MiB = 1 << 20


@pytest.fixture(scope="module")
def engine() -> Iterator[AsyncEngine]:
    eng = AsyncEngine(EngineConfig(model="tiny", kv_cache_bytes=16 * MiB))
    yield eng
    asyncio.run(eng.shutdown())


def request(request_id: str, *segments: str, **sampling: object) -> EngineRequest:
    return EngineRequest(
        request_id, segments or ("Hello there. ",), SamplingParams(**{"max_tokens": 8, **sampling})
    )


async def collect(engine: AsyncEngine, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(req)]


async def wait_until_idle(engine: AsyncEngine) -> None:
    for _ in range(200):
        stats = engine.stats()
        if (
            stats.num_running == 0
            and stats.num_waiting == 0
            and stats.num_free_blocks == stats.num_total_blocks - _pinned_blocks(engine)
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not go idle: {engine.stats()}")


def _pinned_blocks(engine: AsyncEngine) -> int:
    return len({b for blocks in engine.engine.block_manager.pins.values() for b in blocks})


async def test_concurrent_streams_match_and_deltas_add_up(engine: AsyncEngine) -> None:
    prompts = [("Alpha. ",), ("Beta beta. ",), ("Alpha. ", "Gamma?"), ("Delta " * 20,)]
    reqs = [request(f"c{i}", *p, max_tokens=12, ignore_eos=True) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    solo = await collect(engine, request("c-solo", *prompts[3], max_tokens=12, ignore_eos=True))
    for outs in results:
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert sum(len(o.token_ids) for o in outs) == 12 == outs[-1].num_output_tokens
    ids = [t for o in results[3] for t in o.token_ids]
    assert ids == [t for o in solo for t in o.token_ids]  # batching changes nothing
    text = "".join(o.text for o in results[3])
    assert text == engine.engine.tokenizer.decode(ids)


async def test_stop_string_never_leaks(engine: AsyncEngine) -> None:
    full = "".join(
        o.text
        for o in await collect(
            engine, request("s0", "Once upon a time ", max_tokens=24, ignore_eos=True)
        )
    )
    assert len(full) > 6
    stop = full[3:6]
    outs = await collect(
        engine, request("s1", "Once upon a time ", max_tokens=24, ignore_eos=True, stop=(stop,))
    )
    assert outs[-1].finish_reason == "stop"
    text = "".join(o.text for o in outs)
    assert text == full[: full.index(stop)]
    assert all(stop not in o.text for o in outs)


async def test_abort_mid_stream_frees_blocks(engine: AsyncEngine) -> None:
    gen = engine.generate(request("a0", "Tell me a long story. ", max_tokens=500, ignore_eos=True))
    first = await gen.__anext__()
    assert not first.finished
    await gen.aclose()  # closing early aborts
    await wait_until_idle(engine)
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


async def test_injected_failure_fails_only_that_step(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = engine.engine.runner
    real = runner.execute
    calls = {"n": 0}

    def flaky(out: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected")
        return real(out)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "execute", flaky)
    with pytest.raises(EngineError, match="injected"):
        await collect(engine, request("f0"))
    outs = await collect(engine, request("f1"))
    assert outs[-1].finished and outs[-1].finish_reason in ("stop", "length")
    await wait_until_idle(engine)
    engine.engine.block_manager.check_invariants([])


async def test_error_outside_the_forward_fails_all_in_flight(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = engine.engine
    real = llm.step
    calls = {"n": 0}

    def broken() -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug")  # not StepFailed: every request in flight fails
        return real()

    monkeypatch.setattr(llm, "step", broken)
    with pytest.raises(EngineError, match="engine error: bug"):
        await collect(engine, request("g0"))
    await wait_until_idle(engine)  # the failed request's blocks are back, stats say so
    outs = await collect(engine, request("g1"))
    assert outs[-1].finished and outs[-1].finish_reason in ("stop", "length")
    await wait_until_idle(engine)
    llm.block_manager.check_invariants([])


async def test_pin_holds_prefix_until_unpin(engine: AsyncEngine) -> None:
    system = "You are a careful assistant who answers briefly. " * 2
    req = EngineRequest("p0", (system, "Q1?"), SamplingParams(max_tokens=4), pin_prefix_segments=1)
    await collect(engine, req)
    await wait_until_idle(engine)
    pinned = engine.engine.block_manager.pins["p0"]
    assert len(pinned) == len(engine.tokenize(system)) // 16  # full blocks of segment 1
    outs = await collect(engine, EngineRequest("p1", (system, "Q2?"), SamplingParams(max_tokens=4)))
    assert outs[-1].num_cached_tokens >= len(pinned) * 16
    await engine.unpin("p0")
    for _ in range(100):
        if "p0" not in engine.engine.block_manager.pins:
            break
        await asyncio.sleep(0.01)
    assert "p0" not in engine.engine.block_manager.pins
    await wait_until_idle(engine)


async def test_duplicate_and_invalid_requests_raise(engine: AsyncEngine) -> None:
    with pytest.raises(EngineError, match="context window"):
        await collect(engine, request("e0", "x" * 5000))
    long = engine.generate(request("e1", "Go on. ", max_tokens=400, ignore_eos=True))
    await long.__anext__()
    with pytest.raises(EngineError, match="already running"):
        await collect(engine, request("e1"))
    await long.aclose()
    await wait_until_idle(engine)
    # a non-first segment: no BOS; tiny's BPE makes a common word one token
    assert engine.tokenize(" the") == engine.engine.tokenizer.encode(" the", add_bos=False)
    assert len(engine.tokenize(" the")) == 1
    assert engine.model.context_window == 4096


async def test_shutdown_ends_open_streams_with_abort() -> None:
    eng = AsyncEngine.from_config(model="tiny", num_kv_blocks=64)
    gen = eng.generate(request("z0", "Keep going. ", max_tokens=400, ignore_eos=True))
    await gen.__anext__()
    await eng.shutdown()
    rest = [out async for out in gen]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    with pytest.raises(EngineError, match="shut down"):
        await collect(eng, request("z1"))


async def test_one_requests_parameters_never_fail_a_neighbours_stream(
    engine: AsyncEngine,
) -> None:
    """Bad engine-side params (no wire validation in front): a temperature the sampler
    cannot hold and a seed torch refuses fail their own request only; a concurrent stream
    of another session completes."""
    good = asyncio.create_task(collect(engine, request("iso-good", max_tokens=24)))
    await asyncio.sleep(0.05)  # the good stream is decoding when the bad ones arrive
    unchecked = SamplingParams.model_construct  # the engine's params, no bounds checked
    bad_temp = EngineRequest("iso-temp", ("Hi. ",), unchecked(max_tokens=8, temperature=2**1100))
    bad_seed = EngineRequest(
        "iso-seed", ("Hi. ",), unchecked(max_tokens=8, temperature=0.7, seed=2**80)
    )
    for bad in (bad_temp, bad_seed):
        with pytest.raises(EngineError):
            await collect(engine, bad)
    outs = await good
    assert outs[-1].finish_reason in ("stop", "length")
    assert sum(len(o.token_ids) for o in outs) == outs[-1].num_output_tokens
    await wait_until_idle(engine)
    engine.engine.block_manager.check_invariants([])
