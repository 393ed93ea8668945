"""Scheduling decisions, each asserted on the order the engine received requests."""

from __future__ import annotations

import asyncio

from sched_helpers import FakeClock, call, drain, make_scheduler, order, submit
from scripted_engine import FRONT, ScriptedEngine, scripted_text

from eclectus.server.graph.graph import NodeState, VarState
from eclectus.server.graph.scheduler import AppState, GraphScheduler


async def blocked(engine: ScriptedEngine, clock: FakeClock | None = None, **config: object):
    """A scheduler with one slot, held by a blocker call, so later calls queue up."""
    sched = make_scheduler(engine, clock, max_inflight=1, **config)
    blocker = sched.open_app("blocker")
    submit(sched, blocker, calls=[call("block", "b")], gets=[{"var": "b"}])
    return sched


async def test_app_fifo_work_further_along_goes_first() -> None:
    """A graph that arrived earlier keeps its rank for the calls that continue it, so they
    go before a newer application's work that was queued before them."""
    engine, clock = ScriptedEngine(hold=True), FakeClock()
    sched = await blocked(engine, clock, aging_rate=0.0)
    old, new = sched.open_app("old"), sched.open_app("new")
    submit(
        sched,
        old,
        calls=[call("o0", "a"), call("o1", "b", "a")],
        gets=[{"var": "b", "criteria": "throughput"}],
    )
    clock.now += 1
    submit(sched, new, calls=[call("n1", "x")], gets=[{"var": "x", "criteria": "throughput"}])
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "o0", "o1", "n1"]


async def test_a_new_graph_in_a_long_lived_session_ranks_by_its_own_arrival() -> None:
    """App-FIFO ranks graphs, not sessions: an old session's fresh, independent graph does
    not overtake a newer session's earlier graph."""
    engine, clock = ScriptedEngine(hold=True), FakeClock()
    sched = await blocked(engine, clock, aging_rate=0.0)
    long_lived = sched.open_app("long-lived")
    clock.now += 100
    newer = sched.open_app("newer")
    submit(sched, newer, calls=[call("n1", "x")], gets=[{"var": "x", "criteria": "throughput"}])
    clock.now += 1
    submit(
        sched, long_lived, calls=[call("l1", "y")], gets=[{"var": "y", "criteria": "throughput"}]
    )
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "n1", "l1"]


async def test_a_clock_reading_zero_is_an_arrival_like_any_other() -> None:
    """A graph that arrived at clock 0.0 and is got again later keeps 0.0 as its arrival
    (0.0 is falsy: treating it as "no arrival" once made activation loop forever)."""
    engine, clock = ScriptedEngine(hold=True), FakeClock()
    clock.now = 0.0
    sched = await blocked(engine, clock, aging_rate=0.0)
    app = sched.open_app("zero")
    submit(
        sched,
        app,
        calls=[call("z0", "a"), call("z1", "b", "a")],
        gets=[{"var": "b", "criteria": "throughput"}],
    )
    clock.now = 1.0
    submit(sched, app, gets=[{"var": "b", "criteria": "throughput"}])
    assert [app.graph.producer(v).arrival for v in ("a", "b")] == [0.0, 0.0]
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "z0", "z1"]


async def test_a_repeated_get_keeps_a_queued_call_in_submission_order() -> None:
    """Asking again for what is already queued, with no stronger objective, changes no rank:
    the call keeps its place among equals instead of moving behind them."""
    engine = ScriptedEngine(hold=True)
    sched = await blocked(engine, aging_rate=0.0)
    app = sched.open_app("again")
    throughput = {"criteria": "throughput"}
    submit(
        sched,
        app,
        calls=[call("first", "x"), call("second", "y")],
        gets=[{"var": "x", **throughput}, {"var": "y", **throughput}],
    )
    submit(sched, app, gets=[{"var": "x", **throughput}])
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "first", "second"]


async def test_aging_lets_a_long_waiting_call_overtake() -> None:
    """A newer graph's call that has waited long enough outranks an older graph's call that
    has just become ready."""
    engine, clock = ScriptedEngine(hold=True), FakeClock()
    sched = await blocked(engine, clock, aging_rate=0.5)
    old, new = sched.open_app("old"), sched.open_app("new")
    submit(
        sched,
        old,
        vars=[{"id": "later"}],
        calls=[call("o1", "y", "later")],
        gets=[{"var": "y", "criteria": "throughput"}],
    )
    clock.now += 1
    submit(sched, new, calls=[call("n1", "x")], gets=[{"var": "x", "criteria": "throughput"}])
    clock.now += 10  # n1 waited 10 s: credit 5 s > the 1 s head start of "old"
    sched.set_value(old, "later", "now ready")
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "n1", "o1"]


async def test_latency_before_throughput() -> None:
    engine = ScriptedEngine(hold=True)
    sched = await blocked(engine)
    app = sched.open_app("a")
    submit(sched, app, calls=[call("bulk", "x")], gets=[{"var": "x", "criteria": "throughput"}])
    submit(sched, app, calls=[call("chat", "y")], gets=[{"var": "y", "criteria": "latency"}])
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "chat", "bulk"]


async def test_smaller_deadline_slack_first() -> None:
    engine = ScriptedEngine(hold=True)
    sched = await blocked(engine)
    app = sched.open_app("a")
    submit(
        sched,
        app,
        calls=[call("late", "x")],
        gets=[{"var": "x", "criteria": "deadline", "deadline_ms": 5000}],
    )
    submit(
        sched,
        app,
        calls=[call("soon", "y")],
        gets=[{"var": "y", "criteria": "deadline", "deadline_ms": 100}],
    )
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "soon", "late"]


def fan_in(num_maps: int) -> dict:
    calls = [call(f"m{i}", f"s{i}", text=f"map{i}") for i in range(num_maps)]
    calls.append(call("reduce", "final", *[f"s{i}" for i in range(num_maps)]))
    return {"calls": calls}


async def test_fan_in_siblings_of_latency_get_form_one_group() -> None:
    """The maps feeding a latency-critical reduce are dispatched together, with one group id
    and one priority, even past the in-flight limit; the unrelated call waits."""
    engine = ScriptedEngine(hold=True)
    sched = await blocked(engine)
    app = sched.open_app("a")
    submit(sched, app, calls=[call("bg", "z")], gets=[{"var": "z", "criteria": "throughput"}])
    submit(sched, app, **fan_in(4), gets=[{"var": "final", "criteria": "latency"}])
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "m0", "m1", "m2", "m3", "reduce", "bg"]
    maps = [r for r in engine.requests if r.request_id.split("/")[1].startswith("m")]
    assert len({r.group for r in maps}) == 1 and maps[0].group is not None
    assert len({r.priority for r in maps}) == 1


async def test_throughput_get_forms_no_group() -> None:
    engine = ScriptedEngine()
    sched = make_scheduler(engine)
    app = sched.open_app("a")
    submit(sched, app, **fan_in(3), gets=[{"var": "final", "criteria": "throughput"}])
    await drain(sched)
    assert {r.group for r in engine.requests} == {None}


async def test_latency_get_upgrades_upstream_of_an_earlier_throughput_get() -> None:
    """Objectives flow backward and merge: a later latency get makes the shared upstream
    call urgent, so it overtakes queued throughput work."""
    engine = ScriptedEngine(hold=True)
    sched = await blocked(engine)
    app = sched.open_app("a")
    submit(sched, app, calls=[call("bulk", "q")], gets=[{"var": "q", "criteria": "throughput"}])
    submit(
        sched,
        app,
        calls=[call("base", "x"), call("top", "y", "x")],
        gets=[{"var": "x", "criteria": "throughput"}],
    )
    assert app.graph.nodes["base"].objective.criteria == "throughput"
    submit(sched, app, gets=[{"var": "y", "criteria": "latency"}])
    assert app.graph.nodes["base"].objective.criteria == "latency"
    engine.release()
    await drain(sched)
    assert order(sched) == ["block", "base", "top", "bulk"]


async def test_engine_error_fails_the_call_and_its_downstream_only() -> None:
    engine = ScriptedEngine(fail_if=lambda r: "/m1/" in r.request_id)
    sched = make_scheduler(engine)
    app, other = sched.open_app("a"), sched.open_app("b")
    submit(sched, app, **fan_in(3), gets=[{"var": "final"}])
    submit(sched, other, calls=[call("ok", "w")], gets=[{"var": "w"}])
    await drain(sched)
    vars_ = app.graph.vars
    assert vars_["s1"].error_code == "engine_error" and vars_["final"].error_code == "engine_error"
    assert vars_["s0"].state is VarState.READY and vars_["s2"].state is VarState.READY
    assert app.graph.nodes["reduce"].state is NodeState.FAILED
    assert other.graph.vars["w"].state is VarState.READY
    assert "reduce" not in order(sched)


async def test_multi_output_prompts_include_earlier_outputs() -> None:
    """Outputs are generated in order; the second prompt holds the first output's text."""
    engine = ScriptedEngine()
    sched = make_scheduler(engine)
    app = sched.open_app("a")
    segments = [
        {"text": "Q:"},
        {"gen": "a1", "sampling": {"max_tokens": 6}},
        {"text": "\nMore:"},
        {"gen": "a2", "sampling": {"max_tokens": 6}},
    ]
    submit(sched, app, calls=[{"id": "c", "segments": segments}], gets=[{"var": "a2"}])
    await drain(sched)
    first = scripted_text("Q:", 6)
    assert app.graph.vars["a1"].value == first
    assert app.graph.vars["a2"].value == scripted_text(f"Q:{first}\nMore:", 6)
    # each prompt is the flat text, the earlier output entering it as text
    assert [r.prompt_token_ids for r in engine.requests] == [
        FRONT.encode(["Q:"]).token_ids,
        FRONT.encode([f"Q:{first}\nMore:"]).token_ids,
    ]


async def test_ops_run_on_the_server_and_match_python() -> None:
    sched = make_scheduler()
    app = sched.open_app("a")
    texts = ["it's", 'say "hi"', "back\\slash"]
    submit(
        sched,
        app,
        vars=[{"id": f"v{i}", "value": t} for i, t in enumerate(texts)],
        ops=[
            {"id": "r", "op": "repr_list", "inputs": ["v0", "v1", "v2"], "output": "lst"},
            {
                "id": "j",
                "op": "join",
                "inputs": ["v0", "v2"],
                "output": "jn",
                "sep": ", ",
                "prefix": "[",
                "suffix": "]",
            },
        ],
        gets=[{"var": "lst"}, {"var": "jn"}],
    )
    assert app.graph.vars["lst"].value == repr(texts)
    assert app.graph.vars["jn"].value == "[it's, back\\slash]"
    assert sched.metrics.ops_run == 2


async def test_shared_prefix_is_pinned_until_the_last_sharer_dispatches() -> None:
    engine = ScriptedEngine(hold=True)
    sched = make_scheduler(engine, max_inflight=1)
    app = sched.open_app("a")
    shared = "A long shared system prompt. "
    calls = [
        {"id": f"c{i}", "segments": [{"text": shared}, {"text": f"q{i}"}, {"gen": f"o{i}"}]}
        for i in range(3)
    ]
    submit(
        sched, app, calls=calls, gets=[{"var": f"o{i}", "criteria": "throughput"} for i in range(3)]
    )
    await asyncio.sleep(0)  # let the dispatched task reach the engine
    # the flat prompt's ids lying wholly before the shared text's end
    pinned = FRONT.encode([shared, "q0"]).prefix_ends[0]
    assert engine.requests[0].pin_prefix_tokens == pinned > 0
    engine.release()
    await drain(sched)
    await drain(sched)
    assert [r.pin_prefix_tokens for r in engine.requests[1:]] == [0, 0]
    assert engine.unpinned == [engine.requests[0].request_id]


def background_job(sched: GraphScheduler, app: AppState, width: int = 4) -> None:
    calls = [call(f"m{i}", f"o{i}") for i in range(width)]
    gets = [{"var": f"o{i}", "criteria": "throughput"} for i in range(width)]
    submit(sched, app, calls=calls, gets=gets)


async def test_background_trickles_while_a_latency_call_is_in_flight() -> None:
    """While a chat (latency) is in the engine, a throughput job gets at most
    max_background_inflight slots; the rest waits for the chat, then goes at once."""
    engine = ScriptedEngine(hold=True)
    sched = make_scheduler(engine, max_background_inflight=1)
    chats, job = sched.open_app("chats"), sched.open_app("job")
    submit(sched, chats, calls=[call("chat", "y")], gets=[{"var": "y", "criteria": "latency"}])
    background_job(sched, job)
    await asyncio.sleep(0)
    assert order(sched) == ["chat", "m0"]
    assert len(sched.ready) == 3 and sched.num_urgent_inflight == 1
    submit(sched, chats, calls=[call("chat2", "z")], gets=[{"var": "z", "criteria": "latency"}])
    assert order(sched) == ["chat", "m0", "chat2"]  # urgent work is never held back
    # the engine is told which requests are throughput work, to hold them back per step too
    await asyncio.sleep(0)
    background = {r.request_id.split("/")[1]: r.background for r in engine.requests}
    assert background == {"chat": False, "m0": True, "chat2": False}
    engine.release()
    await drain(sched)
    assert sorted(order(sched)[3:]) == ["m1", "m2", "m3"]
    assert sched.num_urgent_inflight == 0 and sched.num_inflight == 0


async def test_background_is_not_capped_without_urgent_work() -> None:
    """With no latency/deadline call in flight, throughput work fills the engine."""
    engine = ScriptedEngine(hold=True)
    sched = make_scheduler(engine, max_background_inflight=1)
    background_job(sched, sched.open_app("job"))
    await asyncio.sleep(0)
    assert order(sched) == ["m0", "m1", "m2", "m3"]
    engine.release()
    await drain(sched)


async def test_a_call_cancelled_before_its_task_ran_frees_its_slot() -> None:
    """A call dispatched and cancelled in the same turn of the loop (a get then a cancel
    read from one buffer) never runs a line of its task, so no ``finally`` of it runs: its
    slot, its tenant's count and its task entry must be freed all the same, or each such
    pair would leak one of max_inflight for good."""
    engine = ScriptedEngine()
    sched = make_scheduler(engine, max_inflight=2)
    app = sched.open_app("s")
    for i in range(5):
        submit(sched, app, calls=[call(f"c{i}", f"v{i}")], gets=[{"var": f"v{i}"}])
        assert sched.num_inflight == 1
        sched.cancel(app, f"v{i}")  # before the task's first step
        await drain(sched)
        assert sched.num_inflight == 0 and app.tasks == {}
    assert sched.metrics.calls_cancelled == 5
    submit(sched, app, calls=[call("ok", "w")], gets=[{"var": "w"}])
    await drain(sched)
    assert app.graph.var("w").state is VarState.READY
