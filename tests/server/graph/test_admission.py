"""Admission (admission.py): the engine gets only what its batch and KV cache have room for,
task groups and map instances included; the rest waits in the scheduler's order. Scripted
engines that report a capacity; the real built-in engine for preemptions."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_helpers import call, drain, make_scheduler, order, submit
from scripted_engine import ScriptedEngine

from eclectus.server.backend import EngineCapacity, EngineOutput, EngineRequest
from eclectus.server.graph.admission import block_keys


class CappedEngine(ScriptedEngine):
    """The scripted engine with a batch and a KV cache of its own; records the most
    requests it ever ran at once, and the most prompt + max_tokens they held together."""

    def __init__(
        self,
        max_seqs: int | None,
        kv_tokens: int | None = None,
        shared_block_size: int | None = None,
        **kwargs: object,
    ):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._capacity = EngineCapacity(1, max_seqs, kv_tokens, shared_block_size)
        self.most_running = 0
        self.most_held = 0
        self._held = 0

    def capacity(self) -> EngineCapacity:
        return self._capacity

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        held = len(request.prompt_token_ids) + (request.sampling.max_tokens or 0)
        self._held += held
        self.most_held = max(self.most_held, self._held)
        self.most_running = max(self.most_running, len(self.running) + 1)
        try:
            async for output in super().generate(request):
                yield output
        finally:
            self._held -= held


def map_frame(map_id: str, width: int, max_tokens: int = 8) -> dict:
    """A map of ``width`` elements, one call each, and a get on its output."""
    items = [f"item {i}" for i in range(width)]
    return {
        "vars": [{"id": f"{map_id}-items", "value": json.dumps(items)}],
        "maps": [
            {
                "id": map_id,
                "items": f"{map_id}-items",
                "element": "x",
                "output": f"{map_id}-out",
                "call": {
                    "id": f"{map_id}-call",
                    "segments": [
                        {"text": "Summarize: "},
                        {"var": "x"},
                        {"gen": "s", "sampling": {"max_tokens": max_tokens}},
                    ],
                },
            }
        ],
        "gets": [{"var": f"{map_id}-out"}],
    }


async def test_a_wide_map_obeys_the_engines_batch() -> None:
    """A 12-wide map and two calls behind it on an engine whose batch is 3: never more than
    3 in the engine, and everything finishes."""
    engine = CappedEngine(max_seqs=3)
    sched = make_scheduler(engine)
    app = sched.open_app("wide")
    submit(sched, app, **map_frame("m", 12))
    submit(sched, sched.open_app("other"), calls=[call("o1", "a"), call("o2", "b")],
           gets=[{"var": "a"}, {"var": "b"}])  # fmt: skip
    await drain(sched, rounds=2000)
    assert engine.most_running == 3
    assert len(engine.requests) == 14
    assert app.graph.vars["m-out"].value is not None


async def test_max_engine_seqs_caps_below_the_engines_batch() -> None:
    engine = CappedEngine(max_seqs=64)
    sched = make_scheduler(engine, max_engine_seqs=2)
    submit(sched, sched.open_app("wide"), **map_frame("m", 8))
    assert sched.num_inflight == 2 and len(sched.queue) == 6
    await drain(sched, rounds=2000)
    assert engine.most_running == 2


async def test_admission_off_lets_max_inflight_through() -> None:
    engine = CappedEngine(max_seqs=2, hold=True)
    sched = make_scheduler(engine, admission="off", max_inflight=6)
    submit(sched, sched.open_app("wide"), **map_frame("m", 8))
    assert sched.num_inflight == 6
    engine.release()
    await drain(sched, rounds=2000)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    widths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    cap=st.integers(1, 6),
    max_inflight=st.integers(1, 8),
)
def test_in_flight_work_never_passes_the_cap(
    widths: list[int], cap: int, max_inflight: int
) -> None:
    """Whatever the maps and caps, the engine never runs more than min(its batch,
    max_inflight) requests, and every map finishes."""

    async def scenario() -> None:
        engine = CappedEngine(max_seqs=cap)
        sched = make_scheduler(engine, max_inflight=max_inflight)
        apps = [sched.open_app(f"a{i}") for i in range(len(widths))]
        for i, (app, width) in enumerate(zip(apps, widths, strict=True)):
            submit(sched, app, **map_frame(f"m{i}", width))
            assert sched.num_inflight <= min(cap, max_inflight)
        await drain(sched, rounds=5000)
        assert engine.most_running <= min(cap, max_inflight)
        assert all(a.graph.vars[f"m{i}-out"].value is not None for i, a in enumerate(apps))

    asyncio.run(scenario())


async def test_kv_reservations_never_pass_the_cache() -> None:
    """Eight prompts of ~100 tokens with 100 to write, on a KV cache of 500 tokens: at
    most 475 (95%) reserved at once, so at most two run together; the waits are counted."""
    engine = CappedEngine(max_seqs=64, kv_tokens=500)
    sched = make_scheduler(engine)
    calls = [call(f"c{i}", f"v{i}", text="x" * 96, max_tokens=100) for i in range(8)]
    submit(sched, sched.open_app("burst"), calls=calls, gets=[{"var": f"v{i}"} for i in range(8)])
    await drain(sched, rounds=5000)
    assert engine.most_held <= 475 and engine.most_running == 2
    assert sched.admission.num_kv_waits == 6
    assert sched.admission.num_reserved_tokens == 0


async def test_a_shared_prefix_is_reserved_once_where_the_engine_shares_it() -> None:
    """Eight calls over one ~110-token preamble, each with its own short question, on a KV
    cache of 600 tokens: counted per request (~124 tokens each) only four fit; the engine
    holds the preamble's full blocks once, and so does admission, so all eight run
    together. On an engine that does not share prefixes the same calls still go four at a
    time."""
    preamble = "The handbook of the harbor says this about every ferry and every boat. " * 4
    calls = [
        call(f"c{i}", f"v{i}", text=f"{preamble}Question {i}: why?", max_tokens=8) for i in range(8)
    ]
    gets = [{"var": f"v{i}"} for i in range(8)]
    for shared, most_running in ((16, 8), (None, 4)):
        engine = CappedEngine(max_seqs=64, kv_tokens=600, shared_block_size=shared, hold=True)
        sched = make_scheduler(engine)
        submit(sched, sched.open_app("chats"), calls=calls, gets=gets)
        for _ in range(50):
            await asyncio.sleep(0)
        assert len(engine.requests) == most_running, shared
        engine.release()
        await drain(sched, rounds=5000)
        assert sched.admission.num_reserved_tokens == 0


async def test_a_prefix_is_shared_within_a_tenant_only() -> None:
    """The same eight calls, each from its own tenant: the engine keeps every tenant's KV
    apart, so admission counts each preamble whole and four run at once."""
    preamble = "The handbook of the harbor says this about every ferry and every boat. " * 4
    engine = CappedEngine(max_seqs=64, kv_tokens=600, shared_block_size=16, hold=True)
    sched = make_scheduler(engine)
    for i in range(8):
        chat = call(f"c{i}", f"v{i}", text=f"{preamble}Question {i}: why?", max_tokens=8)
        submit(sched, sched.open_app(f"chat{i}", tenant=f"t{i}"), calls=[chat],
               gets=[{"var": f"v{i}"}])  # fmt: skip
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(engine.requests) == 4
    engine.release()
    await drain(sched, rounds=5000)
    assert sched.admission.num_reserved_tokens == 0


def test_block_keys_chain_each_block_to_every_id_before_it() -> None:
    """Equal keys at block i mean the same tenant and equal ids up to its end; a partial
    block has no key."""
    a = block_keys(range(70), 32, None)
    b = block_keys([*range(32), 99, *range(33, 64)], 32, None)
    assert len(a) == 2 and len(block_keys(range(31), 32, None)) == 0
    assert a[0] == b[0] and a[1] != b[1]
    assert block_keys([*range(32, 64), *range(32)], 32, None)[1] != a[1]  # other prefix
    assert block_keys(range(70), 32, "t1")[0] != a[0]  # other tenant


def test_blocks_are_keyed_only_while_a_kv_budget_applies() -> None:
    """The dispatch path hashes a prompt's blocks only where they count: with a KV budget.
    Without one (the engine's KV unknown, or admission off) the whole prompt is private."""
    ids = list(range(40))
    budgeted = CappedEngine(max_seqs=8, kv_tokens=4096, shared_block_size=8)
    assert len(make_scheduler(budgeted).admission.kv(ids, 4, 0.0, None).keys) == 5
    unknown = CappedEngine(max_seqs=8, kv_tokens=None, shared_block_size=8)
    off = make_scheduler(budgeted, admission="off")
    for admission in (make_scheduler(unknown).admission, off.admission):
        reservation = admission.kv(ids, 4, 0.0, None)
        assert reservation.keys == () and reservation.private == 44


def test_what_a_request_holds_alone_is_counted_in_whole_blocks() -> None:
    """The engine allocates whole blocks: a prompt's last partial block and the tokens the
    request may write are reserved rounded up to the block, or a full batch of them would
    pass the KV cache by up to a block a request and the engine would preempt."""
    engine = CappedEngine(max_seqs=8, kv_tokens=4096, shared_block_size=8)
    admission = make_scheduler(engine).admission
    assert admission.kv(list(range(43)), 4, 0.0, None).private == 8  # 3 + 4 -> one block
    assert admission.kv(list(range(43)), 6, 0.0, None).private == 16  # 3 + 6 -> two
    assert admission.kv(list(range(40)), 8, 0.0, None).private == 8  # exactly one
    assert admission.kv(list(range(40)), 0, 0.0, None).private == 0


@settings(max_examples=50, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(
            st.integers(0, 3), st.integers(0, 80), st.integers(0, 20), st.sampled_from([None, "t"])
        ),
        min_size=1,
        max_size=12,
    ),
    order=st.randoms(),
)
def test_reserved_tokens_are_the_distinct_blocks_held_plus_each_private_part(
    prompts: list[tuple[int, int, int, str | None]], order: random.Random
) -> None:
    """Whatever prompts (a few shared preambles, tails of any length, two tenants) are
    admitted and released in whatever order, the reserved count is the distinct full blocks
    held times the block size plus each holder's own tokens, and it returns to 0."""

    async def scenario() -> None:
        engine = CappedEngine(max_seqs=64, kv_tokens=10**9, shared_block_size=8)
        admission = make_scheduler(engine).admission
        held = []
        for preamble, tail, most, tenant in prompts:
            ids = [1000 + preamble] * 40 + list(range(tail))
            reservation = admission.kv(ids, most, 0.0, tenant)
            assert len(reservation.keys) == (40 + tail) // 8
            await reservation.__aenter__()
            held.append(reservation)
            distinct = {k for r in held for k in r.keys}
            expected = 8 * len(distinct) + sum(r.private for r in held)
            assert admission.num_reserved_tokens == expected
        order.shuffle(held)
        for reservation in held:
            await reservation.__aexit__(None, None, None)
        assert admission.num_reserved_tokens == 0 and not admission._held

    asyncio.run(scenario())


async def test_a_request_larger_than_the_cache_runs_alone() -> None:
    """One request over the whole KV budget is not refused: it runs when nothing else
    holds the cache."""
    engine = CappedEngine(max_seqs=64, kv_tokens=100)
    sched = make_scheduler(engine)
    calls = [call("big", "b", text="x" * 200), call("small", "s", max_tokens=4)]
    submit(sched, sched.open_app("big"), calls=calls, gets=[{"var": "b"}, {"var": "s"}])
    await drain(sched, rounds=2000)
    assert engine.most_running == 1 and order(sched) == ["big", "small"]


async def test_kv_waiters_go_in_rank_order() -> None:
    """Calls waiting for KV room get it in the scheduler's order: a latency call that
    arrives after throughput calls goes first."""
    engine = CappedEngine(max_seqs=64, kv_tokens=250)
    sched = make_scheduler(engine, max_background_inflight=64)
    batch = [call(f"t{i}", f"t{i}", text="x" * 90, max_tokens=100) for i in range(3)]
    submit(sched, sched.open_app("batch"), calls=batch,
           gets=[{"var": f"t{i}", "criteria": "throughput"} for i in range(3)])  # fmt: skip
    await asyncio.sleep(0)
    chat = call("chat", "c", text="y" * 90, max_tokens=100)
    submit(sched, sched.open_app("chat"), calls=[chat], gets=[{"var": "c"}])
    await drain(sched, rounds=5000)
    started = [r.request_id.split("/")[1] for r in engine.requests]
    assert started[:2] == ["t0", "chat"]


async def test_cancelling_a_maps_output_stops_its_running_instances() -> None:
    """Cancel the map's output while its instances run: the running ones are aborted in
    the engine and the queued ones never start."""
    engine = CappedEngine(max_seqs=2, hold=True)
    sched = make_scheduler(engine)
    app = sched.open_app("m")
    submit(sched, app, **map_frame("m", 5))
    await asyncio.sleep(0.01)
    assert len(engine.requests) == 2 and len(sched.queue) == 3
    sched.cancel(app, "m-out")
    await drain(sched)
    assert sorted(engine.aborted) == sorted(r.request_id for r in engine.requests)
    assert len(engine.requests) == 2 and not sched.queue


async def test_waiters_cancelled_together_leave_no_state_behind() -> None:
    """Two requests waiting for KV room are cancelled at once (a session closed, the loop
    shutting down): the grant pass skips the cancelled ones instead of granting them, and
    the reservations end at 0 with nobody waiting."""
    engine = CappedEngine(max_seqs=64, kv_tokens=100)
    admission = make_scheduler(engine).admission
    first = admission.kv([1] * 60, 30, 0.0, None)
    await first.__aenter__()

    async def wait() -> None:
        async with admission.kv([2] * 60, 30, 1.0, None):
            raise AssertionError("granted while the first holds the cache")

    waiting = [asyncio.create_task(wait()) for _ in range(2)]
    await asyncio.sleep(0)
    assert len(admission._waiters) == 2
    for task in waiting:
        task.cancel()
    await first.__aexit__(None, None, None)  # a grant pass before the tasks see the cancel
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert admission.num_reserved_tokens == 0 and not admission._waiters
