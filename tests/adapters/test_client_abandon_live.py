"""Abandoned streams against the REAL server and engine (tiny model): the engine aborts a
generation whose only reader left, and frees its KV blocks; a variable another call reads
runs to completion (docs/sdk.md, "Abandoned streams")."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from client_live import LiveServer

from eclectus.adapters.client import Gen, VariableFailed, VarState, connect, connect_sync

pytestmark = pytest.mark.slow

LONG = 4000  # tokens: ~10 s of tiny-model decoding here, unless aborted


def scrape(live: LiveServer) -> dict[str, float]:
    """The server's /metrics page as {name: value} (unlabelled samples)."""
    with urllib.request.urlopen(live.server.http_url + "/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    samples = (line.split() for line in lines if line and not line.startswith("#"))
    return {name: float(value) for name, value, *_ in samples if "{" not in name}


def wait_for_idle_engine(live: LiveServer, timeout: float = 5.0) -> dict[str, float]:
    """/metrics once the engine runs and queues nothing (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape(live)
        idle = metrics["eclectus_engine_running"] + metrics["eclectus_engine_waiting"] == 0
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


def server_var_state(live: LiveServer, session_id: str, var_id: str) -> tuple[str, str | None]:
    """The server graph's state and error code of one variable."""
    app = live.server.scheduler.app(session_id)
    assert app is not None, f"session {session_id} is not open"
    variable = app.graph.vars[var_id]
    return variable.state.value, variable.error_code


def assert_aborted(live: LiveServer, before: dict[str, float], after: dict[str, float]) -> None:
    """One call cancelled, the engine idle with every KV block free, far fewer tokens made
    than the call asked for."""
    assert after["eclectus_calls_cancelled_total"] == before["eclectus_calls_cancelled_total"] + 1
    assert after["eclectus_engine_running"] == after["eclectus_engine_waiting"] == 0
    assert after["eclectus_engine_free_blocks"] == after["eclectus_engine_total_blocks"]
    made = after["eclectus_generated_tokens_total"] - before["eclectus_generated_tokens_total"]
    assert made < LONG / 2


async def test_breaking_out_of_a_stream_aborts_the_generation(live_server: LiveServer) -> None:
    """``break`` after the first delta of a long ignore_eos generation: the server cancels
    the call, the engine aborts it and frees its blocks."""
    before = wait_for_idle_engine(live_server)
    async with connect(live_server.url, token=live_server.token) as app:
        (long,) = app.call(["Go on:", Gen(max_tokens=LONG, ignore_eos=True)])
        async for delta in long.astream():
            assert delta
            break
        after = await asyncio.to_thread(wait_for_idle_engine, live_server)
        assert_aborted(live_server, before, after)
        assert server_var_state(live_server, app.session_id, long.id) == ("failed", "cancelled")
        assert long.state is VarState.FAILED


def test_closing_a_blocking_stream_aborts_the_generation(live_server: LiveServer) -> None:
    """The sync twin: leaving ``for delta in var.stream()`` early aborts it too."""
    before = wait_for_idle_engine(live_server)
    with connect_sync(live_server.url, token=live_server.token) as app:
        (long,) = app.call(["Go on:", Gen(max_tokens=LONG, ignore_eos=True)])
        for delta in long.stream(timeout=60):
            assert delta
            break
        assert_aborted(live_server, before, wait_for_idle_engine(live_server))
        with pytest.raises(VariableFailed, match="cancelled"):
            long.get(timeout=5)


async def test_a_streamed_variable_another_call_reads_runs_to_completion(
    live_server: LiveServer,
) -> None:
    """The abandoned variable feeds a declared call: nothing is cancelled, it finishes with
    all its tokens and the reader gets its value."""
    before = wait_for_idle_engine(live_server)
    async with connect(live_server.url, token=live_server.token) as app:
        (fed,) = app.call(["Go on:", Gen(max_tokens=200, ignore_eos=True)])
        (reader,) = app.call(["Continue: ", fed, Gen(max_tokens=4, ignore_eos=True)])
        async for delta in fed.astream():
            assert delta
            break
        assert fed.state is not VarState.FAILED
        assert await reader.aget()
        # the streamed get is still in flight: its value arrives although nobody reads it
        full = await fed.aget()
        assert fed.usage is not None and fed.usage.completion_tokens == 200 and full
        assert server_var_state(live_server, app.session_id, fed.id) == ("ready", None)
    after = await asyncio.to_thread(wait_for_idle_engine, live_server)
    assert after["eclectus_calls_cancelled_total"] == before["eclectus_calls_cancelled_total"]


async def test_leaving_a_reduce_stream_while_its_maps_run_aborts_the_maps(
    live_server: LiveServer,
) -> None:
    """The consumer of a reduce's stream is cancelled while the two map calls it waits for
    generate: the maps (outputs dropped, read only by the reduce) are aborted too."""
    before = wait_for_idle_engine(live_server)
    backend = live_server.server.backend
    async with connect(live_server.url, token=live_server.token) as app:
        spec = Gen(max_tokens=LONG, ignore_eos=True)
        maps = [app.call([f"Part {i}:", spec])[0] for i in range(2)]
        (final,) = app.call(["Combine:", *maps, Gen(max_tokens=8)])
        del maps  # the application keeps only the final answer
        consumer = asyncio.create_task(anext(final.astream()))
        deadline = time.monotonic() + 30
        while backend.stats().num_running < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # until both maps generate
        assert backend.stats().num_running == 2
        consumer.cancel()
        after = await asyncio.to_thread(wait_for_idle_engine, live_server)
    cancelled = after["eclectus_calls_cancelled_total"] - before["eclectus_calls_cancelled_total"]
    assert cancelled == 2  # the two running maps; the reduce had not started
    assert after["eclectus_engine_free_blocks"] == after["eclectus_engine_total_blocks"]
    made = after["eclectus_generated_tokens_total"] - before["eclectus_generated_tokens_total"]
    assert made < LONG
