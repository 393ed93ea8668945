"""Abandoned streams against the recording peer: when closing a stream early sends
``cancel`` for its variable, and every case where it must not (docs/sdk.md, "Abandoned
streams"). The real server's side (the engine aborts, a read variable runs on) is in
test_client_abandon_live.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from client_peer import FakePeer

from eclectus.adapters.client import (
    Gen,
    SemanticVariable,
    Session,
    VariableFailed,
    VarState,
    connect_sync,
)
from eclectus.adapters.client.abandon import Use, Wiring
from eclectus.protocol import CallSpec, GenSegment, OpSpec, SamplingParams, VarSegment


async def cancels_sent(peer: FakePeer, app: Session, count: int) -> list[dict[str, Any]]:
    """The cancel frames once ``count`` arrived (cancels leave from a task of their own);
    after a round trip when expecting none, so a stray one would have arrived."""
    deadline = time.monotonic() + 5
    while len(peer.of_type("cancel")) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await app.count_tokens("sync point")
    return peer.of_type("cancel")


async def first_delta_then_close(var: SemanticVariable) -> str:
    """Reads one delta of ``var``'s stream and closes the stream."""
    stream = var.astream()
    first = await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    return first


async def test_breaking_out_cancels_the_producer(peer: FakePeer, peer_app: Session) -> None:
    """``break`` after the first delta: one cancel for the variable, which fails with
    ``cancelled`` at once, so a later get raises without another frame."""
    peer.hold_values = True
    (out,) = peer_app.call(["Once", Gen(max_tokens=500)])
    async for delta in out.astream():
        assert delta == f"text of {out.id}"[:3]
        break
    (cancel,) = await cancels_sent(peer, peer_app, 1)
    assert cancel["var"] == out.id
    assert out.state is VarState.FAILED
    with pytest.raises(VariableFailed) as caught:
        await out.aget()
    assert caught.value.code == "cancelled" and caught.value.var == out.id
    assert len(peer.of_type("submit")) == 1


async def test_a_variable_read_by_a_declared_call_or_op_is_not_cancelled(
    peer: FakePeer, peer_app: Session
) -> None:
    """The server would fail a reader (and all below it) with its producer: no cancel."""
    peer.hold_values = True
    (by_call,) = peer_app.call(["a", Gen()])
    peer_app.call(["uses ", by_call, Gen()])  # declared, never got: still a reader
    (by_op,) = peer_app.call(["b", Gen()])
    peer_app.join([by_op, "tail"])
    for var in (by_call, by_op):
        await first_delta_then_close(var)
    assert await cancels_sent(peer, peer_app, 0) == []
    assert by_call.state is VarState.PENDING and by_op.state is VarState.PENDING


async def test_another_stream_or_a_pending_get_keeps_it_running(
    peer: FakePeer, peer_app: Session
) -> None:
    """Closing one of two streams, or a stream while a get waits, cancels nothing; the
    last consumer leaving does."""
    peer.hold_values = True
    (out,) = peer_app.call(["x", Gen()])
    first, second = out.astream(), out.astream()
    await anext(first)
    await anext(second)
    await first.aclose()  # type: ignore[attr-defined]
    assert await cancels_sent(peer, peer_app, 0) == []
    waiting = asyncio.create_task(out.aget())
    await asyncio.sleep(0.05)  # the get is in flight
    await second.aclose()  # type: ignore[attr-defined]
    assert await cancels_sent(peer, peer_app, 0) == []
    assert out.state is VarState.PENDING and not waiting.done()
    waiting.cancel()
    (alone,) = peer_app.call(["y", Gen()])
    stream = alone.astream()
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    assert [c["var"] for c in await cancels_sent(peer, peer_app, 1)] == [alone.id]


async def test_a_held_unfinished_sibling_output_keeps_the_call(
    peer: FakePeer, peer_app: Session
) -> None:
    """A cancel fails the call's unfinished outputs: only when the application dropped
    them does an abandoned stream of one output cancel."""
    peer.hold_values = True
    title, body = peer_app.call(["T:", Gen(name="title"), " B:", Gen(name="body")])
    await first_delta_then_close(title)
    assert await cancels_sent(peer, peer_app, 0) == []
    assert body.state is VarState.PENDING
    head = peer_app.call(["T:", Gen(name="title"), " B:", Gen(name="body")])[0]  # tail dropped
    await first_delta_then_close(head)
    assert [c["var"] for c in await cancels_sent(peer, peer_app, 1)] == [head.id]


async def test_a_stream_read_to_its_end_sends_no_cancel(peer: FakePeer, peer_app: Session) -> None:
    """Only an early stop is an abandonment."""
    (out,) = peer_app.call(["x", Gen()])
    assert "".join([d async for d in out.astream()]) == f"text of {out.id}"
    assert await cancels_sent(peer, peer_app, 0) == []
    assert out.state is VarState.READY


async def test_a_cancelled_consumer_task_cancels_the_producer(
    peer: FakePeer, peer_app: Session
) -> None:
    """The task reading the stream is cancelled (a request handler's client left)."""
    peer.hold_values = True
    (out,) = peer_app.call(["x", Gen()])
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in out.astream():
            got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [c["var"] for c in await cancels_sent(peer, peer_app, 1)] == [out.id]
    assert out.state is VarState.FAILED


def test_closing_a_blocking_stream_cancels_the_producer(peer: FakePeer) -> None:
    """The sync twin: ``break`` out of ``var.stream()`` sends the cancel too; the session
    stays usable."""
    peer.hold_values = True
    with connect_sync(peer.url) as app:
        (out,) = app.call(["x", Gen()])
        for _ in out.stream(timeout=5):
            break
        deadline = time.monotonic() + 5
        while not peer.of_type("cancel") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [c["var"] for c in peer.of_type("cancel")] == [out.id]
        with pytest.raises(VariableFailed, match="cancelled"):
            out.get(timeout=5)
        peer.hold_values = False
        (other,) = app.call(["y", Gen()])
        assert other.get(timeout=5) == f"text of {other.id}"


def test_a_timed_out_blocking_stream_cancels_the_producer(peer: FakePeer) -> None:
    """``stream(timeout=…)`` giving up on a silent generation abandons it too."""
    peer.hold_gets = True
    with connect_sync(peer.url) as app:
        (out,) = app.call(["x", Gen()])
        with pytest.raises(TimeoutError):
            next(iter(out.stream(timeout=0.2)))
        assert app.count_tokens("sync point", timeout=5) == 2
        assert [c["var"] for c in peer.of_type("cancel")] == [out.id]


def dropped_but(*used: str) -> Callable[[str], Use]:
    """A ``use`` that says ``wanted`` for ``used`` and ``dropped`` for every other id."""
    return lambda var_id: "wanted" if var_id in used else "dropped"


def call(call_id: str, inputs: list[str], outputs: list[str]) -> CallSpec:
    """A segment-form call reading ``inputs`` and generating ``outputs``."""
    segments = [VarSegment(var=v) for v in inputs] + [GenSegment(gen=v) for v in outputs]
    return CallSpec(id=call_id, segments=segments)


def test_wiring_reads_both_call_forms_and_forgets_released_ids() -> None:
    """Segment and template calls give the same edges; a released id is forgotten."""
    wiring = Wiring()
    template = CallSpec(
        id="c1",
        template="{{doc}}:{{a}}{{b}}",
        bind={"doc": "v1", "a": "v2", "b": "v3"},
        sampling={"a": SamplingParams(), "b": SamplingParams()},
    )
    wiring.note(call=template)
    wiring.note(op=OpSpec(id="o1", op="join", inputs=["v4"], output="v5"))
    assert wiring.producers_to_cancel("v1", dropped_but()) == []  # an input, not an output
    assert wiring.producers_to_cancel("v2", dropped_but("v2")) == ["v2"]
    assert wiring.producers_to_cancel("v2", dropped_but("v2", "v3")) == []  # v3 wanted
    assert wiring.producers_to_cancel("v5", dropped_but()) == []  # an op's output
    wiring.forget(["v2", "v3"])
    assert wiring.producers_to_cancel("v2", dropped_but()) == []  # unknown now


def test_a_released_output_read_by_a_call_still_guards_its_sibling() -> None:
    """Released, v3 may still feed its reader on the server; cancelling the call would
    fail it, so v2's rule must still see the read until every output is released."""
    wiring = Wiring()
    wiring.note(call=call("c1", [], ["v2", "v3"]))
    wiring.note(call=call("c2", ["v3"], ["v4"]))
    wiring.forget(["v3"])
    assert wiring.producers_to_cancel("v2", dropped_but("v2")) == []
    wiring.forget(["v2", "v4"])
    # the SDK never reuses an id: declaring v2 again is the only way to look
    wiring.note(call=call("c5", [], ["v2"]))
    assert wiring.producers_to_cancel("v2", dropped_but("v2")) == ["v2"]


def test_cancelling_goes_upstream_through_work_only_this_stream_waited_for() -> None:
    """Map calls feeding a join feeding the streamed call are cancelled with it, unless
    the application holds a map output or something else reads it."""
    wiring = Wiring()
    wiring.note(call=call("c1", [], ["u1"]))
    wiring.note(call=call("c2", [], ["u2"]))
    wiring.note(op=OpSpec(id="o1", op="join", inputs=["u1", "u2"], output="j"))
    wiring.note(call=call("c3", ["j"], ["p"]))
    assert wiring.producers_to_cancel("p", dropped_but("p")) == ["p", "j", "u1", "u2"]
    assert wiring.producers_to_cancel("p", dropped_but("p", "u2")) == ["p", "j", "u1"]
    finished = wiring.producers_to_cancel("p", lambda v: "finished" if v == "u1" else "dropped")
    assert finished == ["p", "j", "u2"]  # a held, finished output: its call is done
    wiring.note(call=call("c4", ["u1"], ["x"]))  # another reader of u1
    assert wiring.producers_to_cancel("p", dropped_but("p")) == ["p", "j", "u2"]


def test_cancelling_upstream_reaches_a_shared_input_once_all_its_readers_go() -> None:
    """A diamond: u0 feeds both u1 and u2, which feed p; u0 goes once both are doomed."""
    wiring = Wiring()
    wiring.note(call=call("c0", [], ["u0"]))
    wiring.note(call=call("c1", ["u0"], ["u1"]))
    wiring.note(call=call("c2", ["u0"], ["u2"]))
    wiring.note(call=call("c3", ["u1", "u2"], ["p"]))
    assert wiring.producers_to_cancel("p", dropped_but("p")) == ["p", "u1", "u2", "u0"]


async def test_a_stream_left_before_its_first_delta_cancels_the_work_upstream(
    peer: FakePeer, peer_app: Session
) -> None:
    """A reduce whose stream is abandoned while its map calls run: one cancel for the
    reduce's output, then one per map whose output the application dropped; a map output
    it still holds keeps its call."""
    peer.hold_gets = True
    held = peer_app.call(["keep", Gen()])[0]
    (final,) = peer_app.call(
        ["R:", held, peer_app.call(["m0", Gen()])[0], peer_app.call(["m1", Gen()])[0], Gen()]
    )  # the two map outputs are dropped once declared
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(final.astream()), 0.2)
    (submit,) = peer.of_type("submit")
    dropped = [c["segments"][-1]["gen"] for c in submit["calls"][1:3]]
    cancelled = [c["var"] for c in await cancels_sent(peer, peer_app, 3)]
    assert cancelled == [final.id, *dropped] and held.id not in cancelled


def test_declaring_from_threads_while_streams_close(peer: FakePeer) -> None:
    """Readers declared from other threads are all seen by the rule (one lock)."""
    peer.hold_values = True
    with connect_sync(peer.url) as app:
        sources = [app.call([f"s{i}", Gen()])[0] for i in range(30)]

        def read(part: list[SemanticVariable]) -> None:
            for var in part:
                app.call(["reads ", var, Gen()])

        threads = [threading.Thread(target=read, args=(sources[i::3],)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for var in sources:
            for _ in var.stream(timeout=5):
                break
        assert app.count_tokens("sync point", timeout=5) == 2
        assert peer.of_type("cancel") == []
