"""A tenant's fair share of the in-flight slots (``max_inflight_per_tenant``): while another
tenant's calls wait, a tenant holding its share gets no more slots; with nobody else waiting
it gets every slot (work-conserving); latency work still comes before throughput work."""

from __future__ import annotations

from typing import Any

import pytest
from sched_helpers import FakeClock, call, drain, make_scheduler, order, submit
from scripted_engine import ScriptedEngine

from eclectus.server.config import ServerConfig
from eclectus.server.graph.scheduler import GraphScheduler

THROUGHPUT = {"criteria": "throughput"}


def backlog(sched: GraphScheduler, tenant: str, n: int, **get: Any) -> None:
    """``n`` independent calls of one app of ``tenant``, all asked for."""
    app = sched.open_app(f"{tenant}-app", tenant)
    calls = [call(f"{tenant}{i}", f"{tenant}-v{i}") for i in range(n)]
    submit(sched, app, calls=calls, gets=[{"var": f"{tenant}-v{i}", **get} for i in range(n)])


@pytest.mark.parametrize("share", [None, 1])
async def test_a_waiting_tenant_gets_the_next_free_slot(share: int | None) -> None:
    """Alice's backlog fills both slots (nobody else waits); bob's two calls then arrive.
    App-FIFO alone runs all of alice's first; with a share of 1, bob's first call takes
    the first slot alice frees, and the two tenants alternate from there."""
    engine, clock = ScriptedEngine(hold=True), FakeClock()
    sched = make_scheduler(engine, clock, max_inflight=2, max_inflight_per_tenant=share)
    backlog(sched, "alice", 4, **THROUGHPUT)
    assert order(sched) == ["alice0", "alice1"]  # work-conserving: both slots
    clock.now += 1
    backlog(sched, "bob", 2, **THROUGHPUT)
    engine.release()
    await drain(sched)
    if share is None:
        assert order(sched) == ["alice0", "alice1", "alice2", "alice3", "bob0", "bob1"]
    else:
        assert order(sched) == ["alice0", "alice1", "bob0", "alice2", "bob1", "alice3"]


async def test_latency_work_still_comes_first_whoever_holds_the_slots() -> None:
    """Alice holds her share and asks for a chat (latency) while bob's batch waits: the chat
    goes first; fairness orders tenants within a class, never across classes."""
    engine, clock = ScriptedEngine(hold=True), FakeClock()
    sched = make_scheduler(engine, clock, max_inflight=2, max_inflight_per_tenant=1)
    backlog(sched, "alice", 2, **THROUGHPUT)
    clock.now += 1
    backlog(sched, "bob", 2, **THROUGHPUT)
    chat = sched.open_app("alice-chat", "alice")
    submit(sched, chat, calls=[call("chat", "answer")], gets=[{"var": "answer"}])
    engine.release()
    await drain(sched)
    assert order(sched)[:3] == ["alice0", "alice1", "chat"]


def test_the_share_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_inflight_per_tenant must be >= 1, got 0"):
        ServerConfig(max_inflight_per_tenant=0)
