"""Released variables are freed once nothing needs them; a long session stays bounded."""

from __future__ import annotations

from sched_helpers import call, drain, make_scheduler, submit
from scripted_engine import ScriptedEngine
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory, map_reduce

from eclectus.server.graph.release import release


async def test_released_intermediate_waits_for_its_consumer() -> None:
    """An input released while its consumer is still pending survives until it has run."""
    engine = ScriptedEngine(hold=True)
    sched = make_scheduler(engine)
    app = sched.open_app("a")
    submit(sched, app, calls=[call("m", "x"), call("r", "y", "x")], gets=[{"var": "y"}])
    release(app.graph, ["x"])
    assert "x" in app.graph.vars and "m" in app.graph.nodes
    engine.release()
    await drain(sched)
    await drain(sched)
    assert app.graph.vars["y"].value is not None
    assert "x" not in app.graph.vars and "m" not in app.graph.nodes  # freed once r ran
    assert "r" in app.graph.nodes  # its output y is not released
    release(app.graph, ["y", "y", "unknown"])
    assert app.graph.vars == {} and app.graph.nodes == {}


async def test_release_of_a_pending_output_keeps_it_until_final() -> None:
    engine = ScriptedEngine(hold=True)
    sched = make_scheduler(engine)
    app = sched.open_app("a")
    submit(sched, app, calls=[call("m", "x")], gets=[{"var": "x"}])
    assert release(app.graph, ["x"]) == 0
    engine.release()
    await drain(sched)
    await drain(sched)
    assert app.graph.vars == {} and app.graph.nodes == {}


async def test_long_session_with_release_stays_under_the_call_limit(
    make_server: ServerFactory,
) -> None:
    """Many graphs in one session: with release, the per-session limit is never hit."""
    server = await make_server(max_calls_per_session=12, max_vars_per_session=20)
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        for _ in range(10):  # 10 graphs x 6 calls/ops: 60 in all, limit 12 at a time
            assert (await client.ask(map_reduce(4)))["type"] == "ack"
            assert (await client.values(1))["final"]["type"] == "value"
            ids = [f"doc{i}" for i in range(4)] + [f"sum{i}" for i in range(4)]
            reply = await client.ask(
                {"type": "release", "id": "r", "vars": [*ids, "joined", "final"]}
            )
            assert reply == {"type": "ack", "id": "r"}
        app = server.scheduler.app(server.scheduler.snapshot()[0].session_id)
        assert app is not None and app.graph.vars == {} and app.graph.nodes == {}
