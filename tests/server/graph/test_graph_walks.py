"""Every graph walk is linear in the graph's size: adversarial shapes (a DAG of ops with
exponentially many paths, long chains, wide fan-ins) cost milliseconds, not minutes."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from sched_helpers import call, drain, make_scheduler, submit
from scripted_engine import ScriptedEngine

from eclectus.server.graph.graph import NodeState, VarState
from eclectus.server.graph.release import release, sweep


def ladder(depth: int) -> dict[str, Any]:
    """a_i = join(a_{i-1}, b_{i-1}), b_i = join(b_{i-1}, a_{i-1}): 2**depth paths to a0."""
    ops = []
    for i in range(1, depth + 1):
        ops.append({"id": f"oa{i}", "op": "join", "inputs": [f"a{i - 1}", f"b{i - 1}"]})
        ops[-1]["output"] = f"a{i}"
        ops.append({"id": f"ob{i}", "op": "join", "inputs": [f"b{i - 1}", f"a{i - 1}"]})
        ops[-1]["output"] = f"b{i}"
    return {"vars": [{"id": "a0", "value": "x"}, {"id": "b0", "value": "y"}], "ops": ops}


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


async def test_a_get_through_a_ladder_of_ops_is_linear() -> None:
    """D=60 (2**60 paths) with a latency get: the old walk froze for 4.5 s at D=23. The
    texts double per level too: the op that would pass max_frame_bytes fails instead."""
    sched = make_scheduler(max_frame_bytes=4096)
    app = sched.open_app("s")
    frame = ladder(60)
    frame["calls"] = [call("c", "out", "a60", max_tokens=1)]
    frame["gets"] = [{"var": "out", "criteria": "latency"}]
    assert timed(lambda: submit(sched, app, **frame)) < 0.5
    await drain(sched)
    assert len(app.graph.vars["a12"].value or "") == 4096
    failed = app.graph.vars["a13"]
    assert (failed.state, failed.error_code) == (VarState.FAILED, "limit_exceeded")
    assert app.graph.vars["out"].error_code == "limit_exceeded"


async def test_a_ladder_feeding_calls_is_linear() -> None:
    """Calls at the bottom of the ladder, reached along 2**40 paths, still form one group."""
    sched = make_scheduler(ScriptedEngine())
    app = sched.open_app("s")
    frame = ladder(40)
    frame["vars"] = []
    frame["calls"] = [call("ca", "a0", max_tokens=1), call("cb", "b0", max_tokens=1)]
    frame["gets"] = [{"var": "a40", "criteria": "latency"}]
    assert timed(lambda: submit(sched, app, **frame)) < 0.5
    groups = {app.graph.nodes[c].group for c in ("ca", "cb")}
    await drain(sched)
    assert len(groups) == 1 and None not in groups
    assert app.graph.vars["a40"].error_code == "limit_exceeded"


def test_depth_of_a_long_chain_is_iterative() -> None:
    """A chain of 4,000 calls, deepest first, is deeper than Python's recursion limit."""
    sched = make_scheduler()
    app = sched.open_app("s")
    calls = [call("c0", "v0")] + [call(f"c{i}", f"v{i}", f"v{i - 1}") for i in range(1, 4000)]
    submit(sched, app, calls=calls[::-1])
    assert app.graph.depth() == 4000


async def test_a_wide_fan_in_settles_in_linear_time() -> None:
    """A join over 4,000 client-set inputs, set one by one: each set is O(1) amortised."""
    width = 4000
    sched = make_scheduler()
    app = sched.open_app("s")
    inputs = [f"i{k}" for k in range(width)]
    submit(
        sched,
        app,
        vars=[{"id": v} for v in inputs],
        ops=[{"id": "j", "op": "join", "inputs": inputs, "output": "joined"}],
        gets=[{"var": "joined"}],
    )
    elapsed = timed(lambda: [sched.set_value(app, v, "x") for v in inputs])
    assert app.graph.vars["joined"].value == "x" * width
    assert elapsed < 0.5, elapsed


def test_releasing_a_widely_shared_input_is_linear() -> None:
    """One released constant read by 4,000 calls: each finishing call checks it in O(1)
    amortised (it was O(readers) each, 9 s for 8,000)."""
    width = 4000
    sched = make_scheduler()
    app = sched.open_app("s")
    calls = [call(f"c{k}", f"o{k}", "shared") for k in range(width)]
    submit(sched, app, vars=[{"id": "shared", "value": "s"}], calls=calls)
    release(app.graph, ["shared"])
    start = time.perf_counter()
    for k in range(width):  # as the scheduler does when a call completes
        node = app.graph.nodes[f"c{k}"]
        node.state = NodeState.DONE
        sweep(app.graph, [node.node_id], [])
    assert time.perf_counter() - start < 0.5
    assert "shared" not in app.graph.vars


async def test_unpin_tasks_are_held_until_they_ran() -> None:
    """The loop keeps only weak references to tasks: the scheduler holds each unpin task
    until it is done, so a collection cannot drop one before it unpins."""
    engine = ScriptedEngine()
    sched = make_scheduler(engine)
    sched._spawn_unpin(["r1", "r2"])
    assert len(sched._unpin_tasks) == 1
    gc.collect()
    await asyncio.sleep(0.01)
    assert engine.unpinned == ["r1", "r2"]
    assert not sched._unpin_tasks
