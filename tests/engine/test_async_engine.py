"""AsyncEngine only: failures injected into the in-process engine fail what they should and
nothing else. What both engines share is tested over both in test_backends.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from engine_helpers import CONFIG, collect, request, wait_until_idle

from eclectus.server.backend import EngineError
from eclectus.server.engine import AsyncEngine


@pytest.fixture(scope="module")
def engine() -> Iterator[AsyncEngine]:
    eng = AsyncEngine(CONFIG)
    yield eng
    asyncio.run(eng.shutdown())


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
