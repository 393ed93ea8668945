"""Graph building rules: every bad fragment is refused whole, with the right code and field."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sched_helpers import call, make_scheduler, submit
from scripted_engine import ScriptedEngine

from eclectus.server.errors import ServerError
from eclectus.server.graph.graph import NodeState, VarState
from eclectus.server.graph.scheduler import SessionSnapshot


def refused(frame: dict[str, Any], **config: Any) -> ServerError:
    sched = make_scheduler(**config)
    app = sched.open_app("s")
    with pytest.raises(ServerError) as info:
        submit(sched, app, **frame)
    assert app.graph.vars == {} and app.graph.nodes == {}, "a refused fragment left state"
    return info.value


def test_unbalanced_placeholder_is_bad_template() -> None:
    """An unclosed {{ names the call's template field."""
    err = refused({"calls": [{"id": "c", "template": "Hi {{x", "bind": {}}]})
    assert (err.code, err.field) == ("bad_template", "calls[0].template")


def test_duplicate_placeholder_is_bad_template() -> None:
    tpl = "{{a}} and {{a}} {{o}}"
    err = refused(
        {
            "vars": [{"id": "a", "value": "x"}],
            "calls": [
                {"id": "c", "template": tpl, "bind": {"a": "a", "o": "o"}, "sampling": {"o": {}}}
            ],
        }
    )
    assert err.code == "bad_template" and "twice" in err.message


def test_unknown_input_variable_is_named() -> None:
    err = refused({"calls": [call("c", "out", "ghost")]})
    assert (err.code, err.var, err.field) == ("unknown_var", "ghost", "calls[0]")


def test_unknown_get_variable_is_named() -> None:
    err = refused({"vars": [{"id": "a", "value": "x"}], "gets": [{"var": "nope"}]})
    assert (err.code, err.field, err.var) == ("unknown_var", "gets[0].var", "nope")


def test_two_producers_of_one_variable() -> None:
    err = refused({"calls": [call("c1", "x"), call("c2", "x")]})
    assert (err.code, err.var) == ("duplicate_producer", "x")


def test_producing_a_constant_is_a_second_producer() -> None:
    err = refused({"vars": [{"id": "x", "value": "v"}], "calls": [call("c1", "x")]})
    assert (err.code, err.var) == ("duplicate_producer", "x")


def test_cycle_within_a_fragment() -> None:
    err = refused({"calls": [call("a", "x", "y"), call("b", "y", "x")]})
    assert err.code == "cycle" and err.var in ("x", "y")


def test_cycle_across_fragments_is_refused_and_leaves_the_first() -> None:
    """A later fragment closing a loop through earlier nodes is refused; the earlier stays."""
    sched = make_scheduler()
    app = sched.open_app("s")
    submit(sched, app, vars=[{"id": "v"}], calls=[call("q", "w", "v")])
    with pytest.raises(ServerError) as info:
        submit(sched, app, calls=[call("p", "v", "w")])
    assert info.value.code == "cycle"
    assert set(app.graph.nodes) == {"q"} and app.graph.vars["v"].producer is None


def test_atomic_fragment_one_bad_call_adds_nothing() -> None:
    err = refused(
        {
            "vars": [{"id": "a", "value": "x"}],
            "calls": [call("good", "o1", "a"), call("bad", "o2", "missing")],
        }
    )
    assert err.code == "unknown_var"


def test_duplicate_variable_declaration() -> None:
    err = refused({"vars": [{"id": "a", "value": "x"}, {"id": "a", "value": "y"}]})
    assert (err.code, err.field) == ("duplicate_var", "vars[1].id")


def test_graph_limits() -> None:
    calls = [call(f"c{i}", f"o{i}") for i in range(3)]
    assert refused({"calls": calls}, max_calls_per_session=2).code == "limit_exceeded"
    assert refused({"calls": calls}, max_vars_per_session=2).code == "limit_exceeded"


def test_prompt_over_limit_is_refused_at_submit() -> None:
    err = refused({"calls": [call("c", "o", text="x" * 50)]}, max_prompt_tokens=20)
    assert (err.code, err.field) == ("limit_exceeded", "calls[0]")


async def test_lazy_activation_runs_only_upstream_of_the_get() -> None:
    """Two independent chains; a get on one runs that chain only."""
    sched = make_scheduler()
    app = sched.open_app("s")
    submit(
        sched,
        app,
        calls=[call("a", "x"), call("b", "y", "x"), call("other", "z")],
        gets=[{"var": "x"}],
    )
    assert app.graph.nodes["a"].state is NodeState.RUNNING
    assert app.graph.nodes["b"].state is NodeState.IDLE
    assert app.graph.nodes["other"].state is NodeState.IDLE


async def test_set_value_on_produced_variable_is_refused() -> None:
    sched = make_scheduler()
    app = sched.open_app("s")
    submit(sched, app, vars=[{"id": "in"}], calls=[call("a", "x", "in")])
    with pytest.raises(ServerError) as info:
        sched.set_value(app, "x", "nope")
    assert (info.value.code, info.value.var) == ("duplicate_producer", "x")
    sched.set_value(app, "in", "hello")
    assert app.graph.vars["in"].state is VarState.READY


def test_depth_counts_calls_not_ops() -> None:
    sched = make_scheduler()
    app = sched.open_app("s")
    submit(
        sched,
        app,
        calls=[call("a", "x"), call("b", "y"), call("c", "z", "j")],
        ops=[{"id": "j", "op": "join", "inputs": ["x", "y"], "output": "j"}],
    )
    assert app.graph.depth() == 2


async def test_snapshot_shows_each_open_session_with_its_depth() -> None:
    """snapshot() lists the open sessions in opening order with tenant and call depth; a
    closed session leaves it."""
    sched = make_scheduler()
    first, second = sched.open_app("s1", tenant="t1"), sched.open_app("s2")
    submit(sched, first, calls=[call("a", "x"), call("b", "y", "x")])
    assert sched.snapshot() == [SessionSnapshot("s1", "t1", 2), SessionSnapshot("s2", None, 0)]
    await sched.close_app(second)
    assert [s.session_id for s in sched.snapshot()] == ["s1"]


async def test_a_close_under_way_is_waited_for_by_a_second_close() -> None:
    """Shutdown closes every app while each session closes its own: the second close returns
    only once the first has failed the pending variables, so a session never writes its
    close frame before those failures (they were once lost in that race)."""
    engine = ScriptedEngine(hold=True)
    sched = make_scheduler(engine)
    app = sched.open_app("s")
    submit(sched, app, calls=[call("c", "x")], gets=[{"var": "x"}])
    while not engine.requests:  # the call is in the engine, held there
        await asyncio.sleep(0)
    assert app.graph.vars["x"].state is VarState.PENDING
    shutdown = asyncio.ensure_future(sched.close_app(app, "the server is shutting down"))
    await asyncio.sleep(0)  # the shutdown's close is under way, waiting on the call's task
    await sched.close_app(app, "session closed")
    variable = app.graph.vars["x"]
    assert variable.state is VarState.FAILED
    assert variable.error_message == "the server is shutting down"
    await shutdown
